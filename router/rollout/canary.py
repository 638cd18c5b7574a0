"""A canary: a new version on a few replicas, a share of the model's requests sent to it, moved
up in steps, and rolled back on its own when it does worse than the old version.

1. **prepare**: the canary replicas that do not run the new version yet are moved to it by a
   rollout of those replicas alone (router/rollout/executor.py: drain, update, verify,
   readmit), while the split holds them at 0%;
2. **steps**: the share of the model's requests they get goes up step by step (the fleet
   file's ``rollout.canary.steps``, each held ``dwell_s``), or is moved by the operator
   (``step``); the last step held its dwell **promotes**: the split ends and, when there is an
   updater, the rest of the model's replicas are rolled to the new version;
3. all along, every ``check_interval_s``, the judge (router/rollout/judge.py) compares the two
   versions over its window; when the new one is worse the split goes back to 0% at once,
   the audit event says why with both versions' figures, and the canary replicas are rolled
   back to the old version through the executor's rollback (or, for replicas that ran the new
   version before the canary began, a rollout of them to the old version). ``abort`` does the
   same on the operator's word.

Every change is an audit event of kind ``rollout`` (``args.step``: ``canary``, ``share``,
``rollback``, ``promote``, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from router.clock import Clock, monotonic
from router.config.schema import CanaryConfig
from router.control import ControlSurface, EndSplit, SetSplit
from router.core import Assignment, CoreListener, RouterCore
from router.errors import RolloutError
from router.replica import Replica
from router.rollout.command_path import CommandPath
from router.rollout.executor import Phase as RolloutPhase
from router.rollout.executor import Rollout, RolloutSpec
from router.rollout.judge import Judge, Verdict
from router.rollout.split import TrafficSplit
from router.rollout.updaters import Updater

__all__ = ["Canary", "CanaryPhase", "CanarySpec", "StartRollout"]

ACTOR = "rollout"
_ids = itertools.count(1)

StartRollout = Callable[[RolloutSpec], Rollout]
"""Builds and starts a rollout (the manager's, so ``ctl rollout status`` follows it)."""


class CanaryPhase(StrEnum):
    PREPARING = "preparing"
    """The canary replicas are being moved to the new version."""
    RUNNING = "running"
    PROMOTING = "promoting"
    PROMOTED = "promoted"
    ROLLING_BACK = "rolling back"
    ROLLED_BACK = "rolled back"
    ABORTED = "aborted"
    FAILED = "failed"


_ENDED = frozenset(
    {CanaryPhase.PROMOTED, CanaryPhase.ROLLED_BACK, CanaryPhase.ABORTED, CanaryPhase.FAILED}
)


@dataclass(frozen=True, slots=True)
class CanarySpec:
    model: str
    """The stable name both versions serve."""
    old: str
    new: str
    replicas: tuple[str, ...]
    """The canary replicas: they run ``new``."""
    rules: CanaryConfig
    auto: bool = True
    """Step on its own (``rules.steps``, each held ``rules.dwell_s``); False: the operator
    moves the share."""
    updater: Updater | None = None
    """Moves replicas between versions; None: the canary replicas must run ``new`` already,
    and neither a rollback nor a promotion moves a replica."""
    rollout: RolloutSpec | None = None
    """The settings of the rollouts it runs (floor, deadlines); its version and replicas are
    set for each one."""


class _Versions(Protocol):
    @property
    def model(self) -> str: ...
    @property
    def old(self) -> str: ...
    @property
    def new(self) -> str: ...
    @property
    def replicas(self) -> tuple[str, ...]: ...
    @property
    def auto(self) -> bool: ...
    @property
    def rules(self) -> CanaryConfig: ...


class _Named(Protocol):
    @property
    def id(self) -> str: ...


class CanaryState(Protocol):
    """What a canary's status is read from: the live one's (``Canary``) and the simulated
    one's (router/rollout/simulated_canary.py), so both answer key for key."""

    @property
    def id(self) -> str: ...
    @property
    def spec(self) -> _Versions: ...
    @property
    def phase(self) -> CanaryPhase: ...
    @property
    def share(self) -> float: ...
    @property
    def step_index(self) -> int | None: ...
    @property
    def verdict(self) -> Verdict | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def judge(self) -> Judge: ...
    @property
    def rollout(self) -> _Named | None: ...


def canary_status(c: CanaryState, now: float) -> dict[str, Any]:
    """A canary's state, its judge's figures over the window at ``now`` and its verdict."""
    new, old = c.judge.figures(now)
    s, verdict = c.spec, c.verdict
    return {
        "id": c.id,
        "kind": "canary",
        "model": s.model,
        "old": s.old,
        "new": s.new,
        "replicas": list(s.replicas),
        "phase": str(c.phase),
        "share": c.share,
        "auto": s.auto,
        "steps": [p / 100 for p in s.rules.steps],
        "step": c.step_index,
        "figures": {"new": new.to_dict(), "old": old.to_dict()},
        "verdict": None if verdict is None else verdict.text(s.new, s.old),
        "judged": None
        if verdict is None
        else {"new": verdict.new.to_dict(), "old": verdict.old.to_dict()},
        "rollout": None if c.rollout is None else c.rollout.id,
        "error": c.error,
    }


def judge_attempt(
    judge: Judge, spec: _Versions, assignment: Assignment, ok: bool, now: float
) -> None:
    """Count a finished attempt on either version of the canary's model in its judge."""
    if assignment.request.model != spec.model:
        return
    version = assignment.replica.version
    if version not in (spec.new, spec.old):
        return
    first = assignment.first_byte
    ttft = None if first is None else first - assignment.started
    judge.observe(version == spec.new, now, ok, ttft, card(assignment.replica))


def card(replica: Replica) -> str:
    """The card a replica runs on, for comparing like with like: the one its node agent names
    where that differs from the fleet file's (``Replica.gpu_mismatch``), and how many."""
    name = replica.config.gpu_model
    if replica.gpu_mismatch is not None and replica.telemetry is not None:
        name = replica.telemetry.gpu_name or name
    count = len(replica.config.gpus)
    return name if count == 1 else f"{count} x {name}"


class Canary(CoreListener):
    def __init__(
        self,
        spec: CanarySpec,
        core: RouterCore,
        control: ControlSurface,
        start_rollout: StartRollout,
        *,
        actor: str = "operator",
        clock: Clock = monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
        path: CommandPath | None = None,
    ) -> None:
        """``path``: how its split is set (the manager's, router/rollout/command_path.py:
        where the router publishes commands, every router and worker applies it); by
        default on this router alone."""
        self.spec = spec
        self.core = core
        self.control = control
        self.path = path if path is not None else CommandPath(control)
        self.start_rollout = start_rollout
        self.actor = actor
        self.clock = clock
        self._sleep = sleep
        self.id = f"canary-{next(_ids)}"
        moving = [rid for rid in spec.replicas if core.replica(rid).version != spec.new]
        if moving and (spec.updater is None or spec.rollout is None):
            raise RolloutError(
                f"{moving[0]} does not run {spec.new}: give an updater to move the canary there"
            )
        self._moving = tuple(moving)
        self.judge = Judge(spec.rules)
        self.phase = CanaryPhase.PREPARING
        self.share = 0.0
        self.step_index: int | None = None
        self.verdict: Verdict | None = None
        self.error: str | None = None
        self.rollout: Rollout | None = None
        """The rollout that moved the canary replicas (its rollback moves them back)."""
        self._moved = asyncio.Event()
        self._sent: TrafficSplit | None = None
        """The split this canary last set (None: none, or ended)."""
        self._task: asyncio.Task[None] | None = None

    # ---- the operator's words ---------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is not None:
            raise RolloutError(f"{self.id} has already started")
        s = self.spec
        message = (
            f"{self.id}: {s.new} on {', '.join(s.replicas)} beside {s.old} for {s.model}; "
            + (f"steps {_steps_text(s.rules.steps)}" if s.auto else "stepped by the operator")
        )
        self._note(self.actor, "canary", True, message, replicas=list(s.replicas))
        self._set_share(0.0, None)
        self.core.listeners.append(self)
        self._task = asyncio.create_task(self._guarded(self._canary()), name=self.id)
        return self._task

    def step(self, percent: float, actor: str) -> None:
        """The operator sets the new version's share (percent, 0..100)."""
        if self.phase is not CanaryPhase.RUNNING:
            raise RolloutError(f"{self.id} is {self.phase}; the share moves only while running")
        if not 0 <= percent <= 100:
            raise RolloutError(f"the share must be within 0..100 percent, got {percent:g}")
        self._set_share(percent / 100, actor)

    async def promote(self, actor: str) -> None:
        """End the split on the new version and roll the rest of the model's replicas to it
        (when there is an updater); returns once it has begun."""
        if self.phase is not CanaryPhase.RUNNING:
            raise RolloutError(f"{self.id} is {self.phase}; only a running canary is promoted")
        await self._stop_task()
        self._task = asyncio.create_task(self._guarded(self._promote(actor)), name=self.id)

    async def abort(self, actor: str) -> None:
        """Split back to 0% at once, then the canary replicas back to the old version (in
        the background: this returns once the split is at 0%)."""
        if self.phase in _ENDED or self.phase is CanaryPhase.ROLLING_BACK:
            raise RolloutError(f"{self.id} is {self.phase}; there is nothing to abort")
        await self._stop_task()
        self.phase = CanaryPhase.ROLLING_BACK
        self._set_share(0.0, None)
        body = self._roll_back(f"aborted by {actor}", actor, CanaryPhase.ABORTED)
        self._task = asyncio.create_task(self._guarded(body), name=self.id)

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def close(self) -> None:
        await self._stop_task()
        if self.rollout is not None:
            await self.rollout.cancel()
        self._unlisten()

    def status(self) -> dict[str, Any]:
        return canary_status(self, self.clock())

    # ---- the judge's input --------------------------------------------------------------------

    def on_attempt(self, assignment: Assignment, ok: bool) -> None:
        judge_attempt(self.judge, self.spec, assignment, ok, self.clock())

    # ---- the task -----------------------------------------------------------------------------

    async def _guarded(self, body: Coroutine[Any, Any, None]) -> None:
        try:
            await body
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug must not leave the split half set with no word
            self.error = f"{type(exc).__name__}: {exc}"
            self.phase = CanaryPhase.FAILED
            self._set_split(None)
            self._note(ACTOR, "failed", False, f"{self.id}: stopped on an error: {self.error}")
            self._unlisten()

    async def _canary(self) -> None:
        if not await self._prepare():
            return
        self.phase = CanaryPhase.RUNNING
        verdict = await self._run()
        if verdict is None:
            await self._promote(ACTOR)
            return
        why = verdict.text(self.spec.new, self.spec.old)
        await self._roll_back(why, ACTOR, CanaryPhase.ROLLED_BACK, verdict=verdict)

    async def _prepare(self) -> bool:
        if not self._moving:
            return True
        self.rollout = self._roll(self.spec.new, self._moving)
        status = await self.rollout.wait()
        if status.phase is RolloutPhase.DONE:
            return True
        self.error = f"the canary replicas could not be moved to {self.spec.new}: {status.error}"
        self.phase = CanaryPhase.FAILED
        self._note(ACTOR, "failed", False, f"{self.id}: {self.error}")
        await self._roll_back(self.error, ACTOR, CanaryPhase.FAILED, verdict=None)
        return False

    async def _run(self) -> Verdict | None:
        """Step and judge until the last step held its dwell (None: promote)."""
        steps = self.spec.rules.steps if self.spec.auto else ()
        for i, percent in enumerate(steps):
            self.step_index = i
            self._set_share(percent / 100, None)
            verdict = await self._judge_for(self.spec.rules.dwell_s)
            if verdict is not None:
                return verdict
        if self.spec.auto:
            return None
        while True:  # stepped by the operator: judged until promoted or aborted
            verdict = await self._judge_for(None)
            if verdict is not None:
                return verdict

    async def _judge_for(self, seconds: float | None) -> Verdict | None:
        end = None if seconds is None else self.clock() + seconds
        interval = self.spec.rules.check_interval_s
        while end is None or self.clock() < end:
            verdict = self.judge.verdict(self.clock())
            if verdict is not None:
                self.verdict = verdict
                return verdict
            left = interval if end is None else min(interval, end - self.clock())
            await self._sleep(max(left, 0.0))
        return None

    async def _promote(self, actor: str) -> None:
        self.phase = CanaryPhase.PROMOTING
        self._set_split(None)
        rest = self._old_side()
        can_roll = self.spec.updater is not None and self.spec.rollout is not None and rest
        then = f"rolling {', '.join(rest)} to it" if can_roll else "the split ends"
        self._note(actor, "promote", True, f"{self.id}: {self.spec.new} promoted; {then}")
        if can_roll:
            self.rollout = self._roll(self.spec.new, tuple(rest))
            status = await self.rollout.wait()
            if status.phase is not RolloutPhase.DONE:
                self.error = f"the promotion's rollout stopped: {status.error}"
                self.phase = CanaryPhase.FAILED
                self._note(ACTOR, "failed", False, f"{self.id}: {self.error}")
                self._unlisten()
                return
        self.phase = CanaryPhase.PROMOTED
        self._note(ACTOR, "done", True, f"{self.id}: {self.spec.model} is {self.spec.new}")
        self._unlisten()

    async def _roll_back(
        self, why: str, actor: str, end: CanaryPhase, *, verdict: Verdict | None = None
    ) -> None:
        self.phase = CanaryPhase.ROLLING_BACK
        self.error = why
        self._set_share(0.0, None)
        args: dict[str, Any] = {"reason": why}
        if verdict is not None:
            args["new"] = verdict.new.to_dict()
            args["old"] = verdict.old.to_dict()
        self._note(actor, "rollback", True, f"{self.id}: back to 0% {self.spec.new}: {why}", **args)
        ok = await self._replicas_back()
        self._set_split(None)
        self.phase = end if ok else CanaryPhase.FAILED
        where = "every canary replica runs" if ok else "not every canary replica is back on"
        self._note(ACTOR, "rolled back", ok, f"{self.id}: {where} {self.spec.old}")
        self._unlisten()

    async def _replicas_back(self) -> bool:
        """The canary replicas back on the old version, through the executor."""
        if self.spec.updater is None or self.spec.rollout is None:
            return True  # nothing moves them: they stay out of the model's traffic no more
        rollout = self.rollout
        if rollout is not None and rollout.spec.replicas == self._moving and self._moving:
            if rollout.phase not in (RolloutPhase.ROLLED_BACK, RolloutPhase.ROLLING_BACK):
                await rollout.rollback(ACTOR)
            status = await rollout.wait()
            if status.phase is not RolloutPhase.ROLLED_BACK:
                self.error = status.error
                return False
        before = set(self._moving)
        others = tuple(
            rid
            for rid in self.spec.replicas
            if rid not in before and self.core.replica(rid).version == self.spec.new
        )
        if not others:
            return True
        self.rollout = self._roll(self.spec.old, others)
        status = await self.rollout.wait()
        self.error = status.error
        return status.phase is RolloutPhase.DONE

    # ---- helpers ------------------------------------------------------------------------------

    def _roll(self, version: str, replicas: tuple[str, ...]) -> Rollout:
        assert self.spec.rollout is not None  # checked when the canary was made
        return self.start_rollout(replace(self.spec.rollout, version=version, replicas=replicas))

    def _old_side(self) -> list[str]:
        return [
            r.id for r in self.core.pool if r.serves(self.spec.model) and r.version != self.spec.new
        ]

    def _set_share(self, share: float, actor: str | None) -> None:
        split = self._sent
        if split is not None and split.share == share:
            return  # already there (an abort, then its rollback): no second event
        self.share = share
        s = self.spec
        self._set_split(TrafficSplit(s.model, s.old, s.new, share))
        if actor is not None or self._task is not None:
            message = f"{self.id}: {share:.0%} of {s.model} to {s.new}"
            self._note(actor or ACTOR, "share", True, message, share=share)

    def _set_split(self, split: TrafficSplit | None) -> None:
        """Set (or end) the split the way an operator's command is given here."""
        self._sent = split
        if split is None:
            self.path.send(EndSplit(), ACTOR)
        else:
            self.path.send(SetSplit(split.model, split.old, split.new, split.share), ACTOR)

    async def _stop_task(self) -> None:
        task = self._task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _unlisten(self) -> None:
        with contextlib.suppress(ValueError):
            self.core.listeners.remove(self)

    def _note(self, actor: str, step: str, ok: bool, message: str, **args: Any) -> None:
        self.control.note(
            actor,
            "rollout",
            {"canary": self.id, "step": step, "version": self.spec.new, **args},
            ok,
            message,
        )


def _steps_text(steps: tuple[float, ...]) -> str:
    return " -> ".join(f"{p:g}%" for p in steps)
