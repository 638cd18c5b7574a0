"""A canary on the fleet simulator: the live canary's steps, judge and rollback on virtual time.

The same pieces as live (router/rollout/canary.py), on the simulated router:

- the same **split** (router/rollout/split.py), set on the core, so the core's version choice
  (``RouterCore._choose_version``) sends each request of the stable name to one side, and a
  retry after a failed attempt to the other;
- the same **judge** (router/rollout/judge.py), fed from the simulated router's own accounting
  of every finished attempt of the model (``CoreListener.on_attempt``: how it ended and its
  time to first byte at the replica), read on the simulator's clock;
- the same **schedule**: prepared by a rollout of the canary replicas that do not run the new
  version yet (router/rollout/simulated.py, the rest of the fleet counted toward the floor),
  then each of ``rules.steps`` held ``rules.dwell_s`` and judged every ``check_interval_s``
  (at a step's start, then until its dwell is over), the last one held **promotes** (the
  split ends and the rest of the model's replicas are rolled to the new version); a verdict
  puts the split back at 0% at once, the audit event says why with both versions' figures,
  and the rollout that moved the canary replicas is **rolled back**.

Every change is the same audit event as live (kind ``rollout``, ``args.canary``, ``args.step``:
``canary``, ``share``, ``rollback`` with ``reason``, ``new`` and ``old``, ``rolled back``,
``promote``, ``done``), and :meth:`SimulatedCanary.status` has the live status's keys, so a
scenario's checks read either. Everything happens in callbacks of the simulator's clock
(``Simulation.at``), so it is as deterministic as the simulator. The operator's own words (a
manual step, promote, abort) are not simulated: a ``manual`` canary holds its share at 0% and
is judged until the run ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from router.config.schema import CanaryConfig
from router.control import ControlSurface
from router.core import Assignment, CoreListener
from router.errors import RolloutError
from router.rollout.canary import CanaryPhase, canary_status, judge_attempt
from router.rollout.executor import Phase as RolloutPhase
from router.rollout.judge import Judge, Verdict
from router.rollout.simulated import SimRolloutSpec, SimulatedRollout
from router.rollout.split import TrafficSplit
from router.sim.simulator import Simulation

__all__ = ["SimCanarySpec", "SimulatedCanary"]

ACTOR = "rollout"


@dataclass(frozen=True, slots=True)
class SimCanarySpec:
    """What the simulated canary does, in the simulator's seconds."""

    model: str
    """The stable name both versions serve."""
    old: str
    new: str
    replicas: tuple[str, ...]
    """The canary replicas: they run ``new``."""
    rules: CanaryConfig
    auto: bool = True
    """Step on its own; False: the share stays at 0% (no operator in the simulator)."""
    rollout: SimRolloutSpec | None = None
    """The rollouts it runs (their version and replicas set for each); None: no updater, so
    the canary replicas must run ``new`` already and nothing moves a replica."""


class SimulatedCanary(CoreListener):
    """One canary over the simulated fleet of ``sim`` (its first router)."""

    def __init__(
        self,
        sim: Simulation,
        control: ControlSurface,
        spec: SimCanarySpec,
        *,
        actor: str = "operator",
        canary_id: str = "canary-sim",
    ) -> None:
        """RolloutError, as live, when a canary replica does not run the new version and
        there is no updater to move it there."""
        self.sim = sim
        self.core = sim.core
        self.control = control
        self.spec = spec
        self.actor = actor
        self.id = canary_id
        moving = [rid for rid in spec.replicas if self.core.replica(rid).version != spec.new]
        if moving and spec.rollout is None:
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
        self.rollout: SimulatedRollout | None = None
        """The rollout that moved the canary replicas (its rollback moves them back)."""
        self.started_at: float | None = None
        self.rolled_back_at: float | None = None
        """When the split went back to 0% on a verdict (simulator seconds)."""
        self.ended_at: float | None = None
        self._started = False
        self._rollouts = 0
        self._turn = 0
        """Bumped whenever the canary moves on: a check scheduled before is then void."""

    # ---- the run -----------------------------------------------------------------------------

    def start(self) -> None:
        """Begin now (the simulator's clock); the rest follows on its own."""
        if self._started:
            raise RolloutError(f"{self.id} has already started")
        s = self.spec
        steps = " -> ".join(f"{p:g}%" for p in s.rules.steps)
        message = (
            f"{self.id}: {s.new} on {', '.join(s.replicas)} beside {s.old} for {s.model}; "
            + (f"steps {steps}" if s.auto else "stepped by the operator")
        )
        self._note(self.actor, "canary", True, message, replicas=list(s.replicas))
        self._set_share(0.0, None)
        self._started = True
        self.started_at = self.sim.clock.now
        self.core.listeners.append(self)
        if not self._moving:
            self._prepared()
            return
        try:
            self.rollout = self._roll(s.new, self._moving)
        except RolloutError as exc:  # as live: the canary fails with the fleet left serving
            self._fail(f"the canary replicas could not be moved to {s.new}: {exc}")
            return
        self.rollout.start(then=self._prepared)

    def status(self) -> dict[str, Any]:
        """The live canary's status, key for key."""
        return canary_status(self, self.sim.clock.now)

    # ---- the judge's input --------------------------------------------------------------------

    def on_attempt(self, assignment: Assignment, ok: bool) -> None:
        judge_attempt(self.judge, self.spec, assignment, ok, self.sim.clock.now)

    # ---- the schedule ---------------------------------------------------------------------------

    def _prepared(self) -> None:
        self.phase = CanaryPhase.RUNNING
        if self.spec.auto:
            self._step(0)
        else:
            self._judge_until(None, lambda: None)  # judged until the run ends

    def _step(self, i: int) -> None:
        steps = self.spec.rules.steps
        if i == len(steps):
            self._promote(ACTOR)
            return
        self.step_index = i
        self._set_share(steps[i] / 100, None)
        end = self.sim.clock.now + self.spec.rules.dwell_s
        self._judge_until(end, lambda: self._step(i + 1))

    def _judge_until(self, end: float | None, then: Callable[[], None]) -> None:
        """As the live canary's ``_judge_for``: a verdict asked now and every
        ``check_interval_s`` until ``end`` (None: for ever), then ``then``."""
        self._turn += 1
        turn = self._turn

        def check() -> None:
            if turn != self._turn:
                return  # the canary moved on meanwhile
            now = self.sim.clock.now
            if end is not None and now >= end:
                then()
                return
            verdict = self.judge.verdict(now)
            if verdict is not None:
                self.verdict = verdict
                why = verdict.text(self.spec.new, self.spec.old)
                self._roll_back(why, ACTOR, CanaryPhase.ROLLED_BACK, verdict)
                return
            interval = self.spec.rules.check_interval_s
            left = interval if end is None else min(interval, end - now)
            self.sim.at(now + max(left, 0.0), check)

        check()

    def _promote(self, actor: str) -> None:
        self._turn += 1
        self.phase = CanaryPhase.PROMOTING
        self._set_split(None)
        rest = self._old_side()
        can_roll = self.spec.rollout is not None and bool(rest)
        then = f"rolling {', '.join(rest)} to it" if can_roll else "the split ends"
        self._note(actor, "promote", True, f"{self.id}: {self.spec.new} promoted; {then}")
        if not can_roll:
            self._promoted()
            return
        try:
            self.rollout = self._roll(self.spec.new, tuple(rest))
        except RolloutError as exc:
            self._fail(f"the promotion's rollout stopped: {exc}")
            return
        self.rollout.start(then=self._promoted)

    def _promoted(self) -> None:
        self.phase = CanaryPhase.PROMOTED
        self._note(ACTOR, "done", True, f"{self.id}: {self.spec.model} is {self.spec.new}")
        self._end()

    def _roll_back(self, why: str, actor: str, end: CanaryPhase, verdict: Verdict | None) -> None:
        self._turn += 1
        self.phase = CanaryPhase.ROLLING_BACK
        self.error = why
        self._set_share(0.0, None)
        self.rolled_back_at = self.sim.clock.now
        args: dict[str, Any] = {"reason": why}
        if verdict is not None:
            args["new"] = verdict.new.to_dict()
            args["old"] = verdict.old.to_dict()
        self._note(actor, "rollback", True, f"{self.id}: back to 0% {self.spec.new}: {why}", **args)
        self._replicas_back(lambda ok: self._rolled_back(end, ok))

    def _replicas_back(self, then: Callable[[bool], None]) -> None:
        """The canary replicas back on the old version: the rollout that moved them rolled
        back, then a rollout of those that ran the new version before the canary."""
        if self.spec.rollout is None:
            then(True)  # nothing moves them: they stay out of the model's traffic no more
            return
        rollout = self.rollout
        if rollout is not None and rollout.spec.replicas == self._moving and self._moving:
            rollout.rollback(ACTOR, then=lambda: self._others_back(then))
            return
        self._others_back(then)

    def _others_back(self, then: Callable[[bool], None]) -> None:
        before = set(self._moving)
        others = tuple(
            rid
            for rid in self.spec.replicas
            if rid not in before and self.core.replica(rid).version == self.spec.new
        )
        if not others:
            then(True)
            return
        try:
            rollout = self._roll(self.spec.old, others)
        except RolloutError as exc:
            self.error = str(exc)
            then(False)
            return
        self.rollout = rollout
        rollout.start(then=lambda: then(rollout.phase is RolloutPhase.DONE))

    def _rolled_back(self, end: CanaryPhase, ok: bool) -> None:
        self._set_split(None)
        self.phase = end if ok else CanaryPhase.FAILED
        where = "every canary replica runs" if ok else "not every canary replica is back on"
        self._note(ACTOR, "rolled back", ok, f"{self.id}: {where} {self.spec.old}")
        self._end()

    def _fail(self, error: str) -> None:
        self._turn += 1
        self.error = error
        self.phase = CanaryPhase.FAILED
        self._set_split(None)
        self._note(ACTOR, "failed", False, f"{self.id}: {error}")
        self._end()

    def _end(self) -> None:
        self.ended_at = self.sim.clock.now
        with contextlib.suppress(ValueError):
            self.core.listeners.remove(self)

    # ---- helpers ------------------------------------------------------------------------------

    def _roll(self, version: str, replicas: tuple[str, ...]) -> SimulatedRollout:
        assert self.spec.rollout is not None  # checked when the canary was made
        self._rollouts += 1
        spec = replace(self.spec.rollout, version=version, replicas=replicas)
        rollout_id = f"{self.id}-rollout-{self._rollouts}"
        return SimulatedRollout(self.sim, self.control, spec, actor=ACTOR, rollout_id=rollout_id)

    def _old_side(self) -> list[str]:
        return [
            r.id for r in self.core.pool if r.serves(self.spec.model) and r.version != self.spec.new
        ]

    def _set_share(self, share: float, actor: str | None) -> None:
        split = self.core.split
        if split is not None and split.new == self.spec.new and split.share == share:
            return  # already there: no second event
        self.share = share
        s = self.spec
        self._set_split(TrafficSplit(s.model, s.old, s.new, share))
        if actor is not None or self._started:
            message = f"{self.id}: {share:.0%} of {s.model} to {s.new}"
            self._note(actor or ACTOR, "share", True, message, share=share)

    def _set_split(self, split: TrafficSplit | None) -> None:
        self.core.set_split(split)

    def _note(self, actor: str, step: str, ok: bool, message: str, **args: Any) -> None:
        self.control.note(
            actor,
            "rollout",
            {"canary": self.id, "step": step, "version": self.spec.new, **args},
            ok,
            message,
        )
