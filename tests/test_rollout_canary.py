"""The canary (router/rollout/canary.py) on a real core and control surface, with a fake
updater and probe standing for the replicas and a clock that moves only when the canary
sleeps: a failing new version is rolled back on its own (split to 0% at once, the event with
both figures, the replica back on the old version through the executor's rollback); a
healthy one steps up and is promoted; abort and the operator's steps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from router.clock import ManualClock
from router.config.schema import CanaryConfig
from router.control import ControlSurface
from router.core import Outcome, RouterCore
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.request import Request
from router.rollout.canary import Canary, CanaryPhase, CanarySpec
from router.rollout.executor import Rollout, RolloutSpec
from router.rollout.probe import Serving
from router.rollout.updaters import Target, UpdateResult
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder

MODEL = OLD = "test-model"
NEW = "test-model-v2"
RULES = CanaryConfig(
    steps=(10.0, 50.0), dwell_s=5.0, window_s=100.0, min_requests=5, check_interval_s=1.0
)


class Fleet:
    """What each replica serves; the updater switches it, the probe reads it."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.serving = {r.config.endpoint: OLD for r in core.pool}
        self.updates: list[Target] = []

    async def check(self, base_url: str, version: str) -> Serving:
        served = self.serving[base_url]
        return Serving((served,), None if served == version else f"serves {served}")

    def describe(self, target: Target) -> str:
        return f"switch {target.replica} to {target.version}"

    async def update(self, target: Target) -> UpdateResult:
        self.updates.append(target)
        self.serving[target.url] = target.version
        return UpdateResult(True, "exit 0")

    def learn(self, replica: Replica, models: tuple[str, ...]) -> None:
        replica.served_models = tuple(dict.fromkeys((*models, MODEL)))


class Harness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        fleet = make_fleet([1.0] * 4, [64] * 4)
        self.core = RouterCore(fleet, clock=self.clock, rng=random.Random(3))
        for r in self.core.pool:
            r.served_models = (OLD,)
        self.control = ControlSurface(self.core)
        self.fleet = Fleet(self.core)
        self.recorder = Recorder()
        self.core.listeners.append(self.recorder)
        self.gate = asyncio.Event()
        """Set: the canary's clock runs (each of its sleeps advances it)."""
        self.rollouts: list[Rollout] = []
        self._n = 0

    async def sleep(self, seconds: float) -> None:
        if self.clock() > 1000:  # bounds a canary that never decides (its task ends failed)
            raise AssertionError("the canary ran 1000 s of its clock without deciding")
        await self.gate.wait()
        self.clock.advance(seconds)
        await asyncio.sleep(0)

    def start_rollout(self, spec: RolloutSpec) -> Rollout:
        rollout = Rollout(
            spec, self.core, self.control, self.fleet, actor="rollout", learn=self.fleet.learn
        )
        self.rollouts.append(rollout)
        rollout.start()
        return rollout

    def canary(self, *, auto: bool = True, updater: bool = True) -> Canary:
        rollout = RolloutSpec(NEW, self.fleet, floor=0.5, check_interval_s=0.001)
        spec = CanarySpec(
            MODEL,
            OLD,
            NEW,
            ("r0",),
            RULES,
            auto,
            self.fleet if updater else None,
            rollout if updater else None,
        )
        return Canary(
            spec,
            self.core,
            self.control,
            self.start_rollout,
            actor="alice",
            clock=self.clock,
            sleep=self.sleep,
        )

    def traffic(self, n: int, *, new_fails: bool) -> None:
        """``n`` requests for the stable name, each settled: on the new version it fails
        (its retry goes to the old one) when ``new_fails``; the rest complete."""
        for _ in range(n):
            self._n += 1
            assert self.core.submit(Request(f"q{self._n}", 10, 10, 0.0, model=MODEL)) is None
            while live := self.recorder.live(self.core.running):
                for a in live:
                    if new_fails and a.replica.version == NEW:
                        self.core.fail(a, f"{a.replica.id} answered 500")
                    else:
                        self.core.first_byte(a)
                        self.core.complete(a)

    def steps(self) -> list[str]:
        return [e.args["step"] for e in self.control.audit if e.kind == "rollout"]


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(20_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


async def test_a_failing_canary_is_rolled_back_on_its_own() -> None:
    h = Harness()
    canary = h.canary(auto=False)
    canary.start()
    await until(lambda: canary.phase is CanaryPhase.RUNNING)
    assert h.core.replica("r0").version == NEW
    canary.step(50, "alice")
    h.traffic(60, new_fails=True)
    assert h.core.outcomes[Outcome.FAILED] == 0  # every failure was retried on the old version
    h.gate.set()
    await canary.wait()
    assert canary.phase is CanaryPhase.ROLLED_BACK
    assert canary.share == 0.0
    assert h.core.split is None
    assert h.core.replica("r0").version == OLD
    assert {r.state for r in h.core.pool} == {ReplicaState.ACTIVE}
    (event,) = [e for e in h.control.audit if "canary" in e.args and e.args["step"] == "rollback"]
    assert event.args["new"]["error_rate"] == 1.0
    assert event.args["old"]["error_rate"] == 0.0
    assert "error rate" in event.message
    assert f"{NEW} error rate 100.0%" in event.message
    assert [t.version for t in h.fleet.updates] == [NEW, OLD]
    assert h.steps()[-1] == "rolled back"


async def test_the_split_goes_to_0_percent_before_the_replicas_move_back() -> None:
    h = Harness()
    canary = h.canary(auto=False)
    canary.start()
    await until(lambda: canary.phase is CanaryPhase.RUNNING)
    canary.step(50, "alice")
    h.traffic(60, new_fails=True)
    shares: list[float] = []
    h.control.subscribe(
        lambda e: (
            shares.append(h.core.split.share if h.core.split else -1.0)
            if e.kind == "drain"
            else None
        )
    )
    h.gate.set()
    await canary.wait()
    assert shares == [0.0]  # when the rollback drained r0, no request could be sent there


async def test_a_healthy_canary_steps_up_and_is_promoted_with_the_rest_rolled() -> None:
    h = Harness()
    h.gate.set()
    canary = h.canary()
    canary.start()
    await canary.wait()
    assert canary.phase is CanaryPhase.PROMOTED, canary.error
    shares = [e.args["share"] for e in h.control.audit if e.args.get("step") == "share"]
    assert shares == [0.1, 0.5]
    assert h.core.split is None
    assert {r.version for r in h.core.pool} == {NEW}


async def test_a_slow_canary_is_rolled_back_on_its_p99_ttft() -> None:
    h = Harness()
    canary = h.canary(auto=False)
    canary.start()
    await until(lambda: canary.phase is CanaryPhase.RUNNING)
    canary.step(50, "alice")
    for _ in range(60):
        h.core.submit(Request(f"s{_}", 10, 10, h.clock(), model=MODEL))
        for a in h.recorder.live(h.core.running):
            slow = 5.0 if a.replica.version == NEW else 1.0
            h.clock.advance(slow)
            h.core.first_byte(a)
            h.core.complete(a)
    h.gate.set()
    await canary.wait()
    assert canary.phase is CanaryPhase.ROLLED_BACK
    assert canary.verdict is not None
    assert "p99 TTFT" in canary.verdict.reason


async def test_abort_sends_nothing_more_to_the_new_version_and_moves_it_back() -> None:
    h = Harness()
    canary = h.canary(auto=False)
    canary.start()
    await until(lambda: canary.phase is CanaryPhase.RUNNING)
    canary.step(100, "alice")
    await canary.abort("bob")
    assert canary.share == 0.0
    assert h.core.split is not None
    assert h.core.split.share == 0.0
    h.gate.set()
    await canary.wait()
    assert canary.phase is CanaryPhase.ABORTED
    assert h.core.replica("r0").version == OLD
    assert h.core.split is None


async def test_a_canary_without_an_updater_needs_its_replicas_on_the_new_version() -> None:
    h = Harness()
    with pytest.raises(RolloutError, match="r0 does not run test-model-v2"):
        h.canary(updater=False)


async def test_the_operator_steps_only_within_0_to_100_and_only_while_running() -> None:
    h = Harness()
    canary = h.canary(auto=False)
    with pytest.raises(RolloutError, match="preparing"):
        canary.step(10, "alice")
    canary.start()
    await until(lambda: canary.phase is CanaryPhase.RUNNING)
    with pytest.raises(RolloutError, match=r"0\.\.100"):
        canary.step(120, "alice")
    await canary.close()
