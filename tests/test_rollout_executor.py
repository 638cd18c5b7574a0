"""The rollout executor (router/rollout/executor.py) on a real core and control surface, with
a fake updater and probe standing for the replicas: drain, update, verify, readmit; pause,
abort, rollback; failures leave the fleet serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from router.control import ControlSurface
from router.core import RouterCore
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.request import Request
from router.rollout.executor import Phase, Rollout, RolloutSpec, Step
from router.rollout.plan import PlanError
from router.rollout.probe import Serving
from router.rollout.updaters import Target, UpdateResult
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder

OLD, NEW = "test-model", "test-model-v2"


class FakeReplicas:
    """What each replica serves, by URL; the probe reads it and the updater changes it."""

    def __init__(self, core: RouterCore) -> None:
        self.serving = {r.config.endpoint: OLD for r in core.pool}

    async def check(self, base_url: str, version: str) -> Serving:
        served = self.serving[base_url]
        if served is None:
            return Serving(None, "cannot connect")
        return Serving((served,), None if served == version else f"serves {served}")


class FakeUpdater:
    """Switches the replica at once, unless told to fail it, break it or hold it."""

    def __init__(self, replicas: FakeReplicas) -> None:
        self.replicas = replicas
        self.done: list[Target] = []
        self.fail: set[str] = set()
        self.breaks: set[str] = set()
        """Replicas whose update fails and leaves them serving nothing."""
        self.stuck: set[str] = set()
        """Replicas whose update succeeds but that never serve the new version."""
        self.gate: asyncio.Event | None = None

    def describe(self, target: Target) -> str:
        return f"switch {target.replica} to {target.version}"

    async def update(self, target: Target) -> UpdateResult:
        if self.gate is not None:
            await self.gate.wait()
        self.done.append(target)
        if target.replica in self.breaks:
            self.replicas.serving[target.url] = None  # type: ignore[assignment]  # down
            return UpdateResult(False, "exit 1", "unit failed")
        if target.replica in self.fail:
            return UpdateResult(False, "exit 1", "no such unit")
        if target.replica not in self.stuck:
            self.replicas.serving[target.url] = target.version
        return UpdateResult(True, "exit 0")


class Harness:
    def __init__(self, weights: tuple[float, ...] = (2.0, 2.0, 1.0, 1.0)) -> None:
        self.core = RouterCore(make_fleet(weights))
        self.control = ControlSurface(self.core)
        self.recorder = Recorder()
        self.core.listeners.append(self.recorder)
        self.replicas = FakeReplicas(self.core)
        self.updater = FakeUpdater(self.replicas)
        self.learned: dict[str, tuple[str, ...]] = {}

    def rollout(self, **settings: object) -> Rollout:
        options: dict[str, object] = {"floor": 0.6, "check_interval_s": 0.001}
        options.update(settings)
        spec = RolloutSpec(NEW, self.updater, **options)  # type: ignore[arg-type]  # test knobs
        return Rollout(
            spec, self.core, self.control, self.replicas, actor="alice", learn=self._learn
        )

    def _learn(self, replica: Replica, models: tuple[str, ...]) -> None:
        self.learned[replica.id] = models

    def states(self) -> dict[str, ReplicaState]:
        return {r.id: r.state for r in self.core.pool}

    def steps_in_trail(self) -> list[str]:
        return [e.args["step"] for e in self.control.audit if e.kind == "rollout"]

    def submit(self, rid: str, request_id: str) -> None:
        """A request placed on ``rid`` (the others made full for the moment)."""
        others = [r for r in self.core.pool if r.id != rid]
        for r in others:
            r.batch_size = 0
            self.core.pool.changed(r)
        assert self.core.submit(Request(request_id, 10, 10, arrival=self.core.clock())) is None
        for r in others:
            r.batch_size = r.config.batch_size
            self.core.pool.changed(r)
        assert self.core.running[request_id].replica.id == rid


async def until(condition: Callable[[], bool]) -> None:
    """Let the rollout's task run until ``condition`` holds (bounded)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not met")


async def test_a_rollout_updates_every_replica_wave_by_wave_and_leaves_all_in_service() -> None:
    h = Harness()
    rollout = h.rollout()
    assert [w.replicas for w in rollout.plan.waves] == [("r2", "r3"), ("r0",), ("r1",)]
    rollout.start()
    status = await rollout.wait()
    assert status.phase is Phase.DONE
    assert set(status.steps.values()) == {Step.UPDATED}
    assert status.versions == dict.fromkeys(("r0", "r1", "r2", "r3"), NEW)
    assert [t.replica for t in h.updater.done] == ["r2", "r3", "r0", "r1"]
    assert set(h.states().values()) == {ReplicaState.ACTIVE}
    assert h.learned == dict.fromkeys(("r0", "r1", "r2", "r3"), (NEW,))
    assert status.capacity_lowest >= 0.6
    assert status.capacity_now == 1.0
    trail = h.steps_in_trail()
    assert trail[0] == "start"
    assert trail[-1] == "done"
    assert trail.count("serving") == 4
    drains = [(e.actor, e.args["replica"]) for e in h.control.audit if e.kind == "drain"]
    assert drains == [("rollout", "r2"), ("rollout", "r3"), ("rollout", "r0"), ("rollout", "r1")]
    assert next(e for e in h.control.audit if e.kind == "rollout").actor == "alice"


async def test_capacity_never_falls_under_the_floor_while_waves_are_out() -> None:
    h = Harness()
    rollout = h.rollout(floor=0.6)
    shares: list[float] = []
    h.control.subscribe(lambda _: shares.append(rollout.status().capacity_now))
    rollout.start()
    await rollout.wait()
    assert min(shares) >= 0.6
    assert min(shares) == rollout.status().capacity_lowest


async def test_no_update_starts_while_a_request_is_in_flight_on_the_replica() -> None:
    h = Harness()
    h.submit("r2", "q1")
    rollout = h.rollout()
    rollout.start()
    await until(lambda: h.core.replica("r3").state is ReplicaState.DRAINED)
    assert h.core.replica("r2").state is ReplicaState.DRAINING
    assert h.updater.done == []
    h.core.complete(h.core.running["q1"])
    status = await rollout.wait()
    assert status.phase is Phase.DONE
    assert status.waited_for == 1
    assert h.recorder.outcome_of("q1") == "completed"


async def test_past_the_drain_deadline_preempt_moves_the_request_elsewhere() -> None:
    h = Harness()
    h.submit("r2", "q1")
    rollout = h.rollout(drain_timeout_s=0.001, on_drain_timeout="preempt")
    rollout.start()
    await until(lambda: rollout.status().requests_moved == 1)
    # Re-queued before its first byte: it runs on a replica in service.
    assert h.core.running["q1"].replica.id not in ("r2", "r3")
    h.core.complete(h.core.running["q1"])
    status = await rollout.wait()
    assert status.phase is Phase.DONE
    assert h.recorder.outcome_of("q1") == "completed"
    assert "drain deadline" in h.steps_in_trail()


async def test_past_the_drain_deadline_wait_waits_on() -> None:
    h = Harness()
    h.submit("r2", "q1")
    rollout = h.rollout(drain_timeout_s=0.001, on_drain_timeout="wait")
    rollout.start()
    await until(lambda: "drain deadline" in h.steps_in_trail())
    assert h.core.replica("r2").state is ReplicaState.DRAINING
    h.core.complete(h.core.running["q1"])
    assert (await rollout.wait()).phase is Phase.DONE
    assert rollout.status().requests_moved == 0


async def test_a_failed_update_stops_the_rollout_and_readmits_the_replica_on_its_old_version() -> (
    None
):
    h = Harness()
    h.updater.fail.add("r3")
    rollout = h.rollout()
    rollout.start()
    status = await rollout.wait()
    assert status.phase is Phase.FAILED
    assert status.error == "r3: the update failed: exit 1"
    assert status.steps == {
        "r2": Step.UPDATED,
        "r3": Step.KEPT,
        "r0": Step.PENDING,
        "r1": Step.PENDING,
    }
    assert set(h.states().values()) == {ReplicaState.ACTIVE}
    failed = [e for e in h.control.audit if e.kind == "rollout" and not e.ok]
    assert "no such unit" in failed[0].args["output"]


async def test_a_replica_broken_by_its_update_is_left_drained_and_flagged() -> None:
    h = Harness()
    h.updater.breaks.add("r2")
    rollout = h.rollout()
    rollout.start()
    status = await rollout.wait()
    assert status.phase is Phase.FAILED
    assert status.steps["r2"] is Step.FLAGGED
    assert h.core.replica("r2").state is ReplicaState.DRAINED
    others = {rid: s for rid, s in h.states().items() if rid != "r2"}
    assert set(others.values()) == {ReplicaState.ACTIVE}
    assert "flagged" in h.steps_in_trail()


async def test_a_replica_that_never_serves_the_new_version_stops_the_rollout() -> None:
    h = Harness()
    h.updater.stuck.add("r2")
    rollout = h.rollout(ready_timeout_s=0.001)
    rollout.start()
    status = await rollout.wait()
    assert status.phase is Phase.FAILED
    assert status.error is not None
    assert status.error.startswith(f"r2: does not serve {NEW} after 0.001 s: serves {OLD}")
    assert status.steps["r2"] is Step.KEPT
    assert set(h.states().values()) == {ReplicaState.ACTIVE}


async def test_pause_holds_between_waves_and_resume_goes_on() -> None:
    h = Harness()
    h.updater.gate = asyncio.Event()
    rollout = h.rollout()
    rollout.start()
    await until(lambda: rollout.status().steps["r2"] is Step.UPDATING)
    rollout.pause("bob")
    h.updater.gate.set()
    await until(lambda: rollout.status().steps["r3"] is Step.UPDATED)
    for _ in range(100):
        await asyncio.sleep(0)
    assert rollout.status().phase is Phase.PAUSED
    assert rollout.status().steps["r0"] is Step.PENDING
    assert set(h.states().values()) == {ReplicaState.ACTIVE}
    rollout.resume("bob")
    assert (await rollout.wait()).phase is Phase.DONE
    pause = next(e for e in h.control.audit if e.kind == "rollout" and e.args["step"] == "pause")
    assert pause.actor == "bob"


async def test_abort_while_draining_readmits_the_wave_unchanged() -> None:
    h = Harness()
    h.submit("r2", "q1")
    rollout = h.rollout()
    rollout.start()
    await until(lambda: h.core.replica("r3").state is ReplicaState.DRAINED)
    rollout.abort()
    status = await rollout.wait()
    assert status.phase is Phase.ABORTED
    assert h.updater.done == []
    assert set(status.steps.values()) <= {Step.KEPT, Step.PENDING}
    assert set(h.states().values()) == {ReplicaState.ACTIVE}
    assert h.core.running["q1"].replica.id == "r2"  # its request was never disturbed


async def test_rollback_returns_every_updated_replica_to_its_old_version() -> None:
    h = Harness()
    rollout = h.rollout()
    rollout.start()
    await rollout.wait()
    await rollout.rollback("carol")
    status = await rollout.wait()
    assert status.phase is Phase.ROLLED_BACK
    assert set(status.steps.values()) == {Step.ROLLED_BACK}
    assert set(h.replicas.serving.values()) == {OLD}
    assert [t.version for t in h.updater.done[4:]] == [OLD] * 4
    assert set(h.states().values()) == {ReplicaState.ACTIVE}
    assert status.capacity_lowest >= 0.6


async def test_rollback_after_a_failure_fixes_the_flagged_replica_too() -> None:
    h = Harness()
    h.updater.breaks.add("r3")
    rollout = h.rollout()
    rollout.start()
    await rollout.wait()
    h.updater.breaks.clear()
    await rollout.rollback()
    status = await rollout.wait()
    assert status.phase is Phase.ROLLED_BACK
    assert status.steps["r3"] is Step.ROLLED_BACK
    assert status.steps["r2"] is Step.ROLLED_BACK
    assert set(h.states().values()) == {ReplicaState.ACTIVE}


def test_a_rollout_starts_with_every_replica_in_service() -> None:
    h = Harness()
    h.core.drain("r1")
    with pytest.raises(RolloutError, match="r1 is drained; a rollout starts with every replica"):
        h.rollout()


def test_a_floor_that_cannot_be_kept_is_refused_naming_the_replica() -> None:
    h = Harness(weights=(8.0, 1.0, 1.0))
    with pytest.raises(PlanError, match="r0 alone is"):
        h.rollout(floor=0.75)


async def test_commands_out_of_turn_are_refused() -> None:
    h = Harness()
    rollout = h.rollout()
    with pytest.raises(RolloutError, match="not paused"):
        rollout.resume()
    rollout.start()
    with pytest.raises(RolloutError, match="already started"):
        rollout.start()
    await rollout.wait()
    with pytest.raises(RolloutError, match="only a running rollout pauses"):
        rollout.pause()
    with pytest.raises(RolloutError, match="nothing to abort"):
        rollout.abort()
