"""A rollout on the fleet simulator: the live plan, run wave by wave on virtual time.

The same plan as live (router/rollout/plan.py, from the simulated router's learned capacity,
or from the capacities given, which is how a prediction uses the live router's own), and the
same commands on the same control surface: each wave is drained, waits until nothing is in
flight on it (past ``drain_timeout_s``: ``wait`` waits on, ``preempt`` frees it now, the core's
``preempt`` with high priority included), is out of service for its load time, then serves the
new version and is readmitted. The next wave starts when the last is back.

The load time is what the update takes before the replica answers again: the emulator
updater's ``load_s``, or for a command or HTTP updater the operator's estimate
(``load_estimate_s``; a real update's time is not known before it runs). The replica is seen
serving at the first readiness check at or after it, as live: checks at the update's start
and every ``check_interval_s`` after. Updates do not fail here: a simulated rollout answers
"what does the plan cost the traffic", not "does the new version work".

Everything happens in callbacks of the simulator's clock (``Simulation.at``) and the core's
state events, so it is as deterministic as the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from router.control import ControlSurface, Drain, Preempt, Undrain
from router.core import CoreListener
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.rollout.executor import ACTOR, Phase, RolloutStatus, Step
from router.rollout.meter import RolloutFigures, RolloutMeter
from router.rollout.plan import Member, Order, Plan, plan_waves
from router.sim.simulator import Simulation

__all__ = ["SimRolloutSpec", "SimulatedRollout"]


@dataclass(frozen=True, slots=True)
class SimRolloutSpec:
    """What the simulated rollout does, in the simulator's seconds."""

    version: str
    load_s: float
    """Seconds from a replica's update to its first chance to serve again."""
    floor: float = 0.75
    order: Order = "weakest-first"
    drain_timeout_s: float = 300.0
    on_drain_timeout: Literal["wait", "preempt"] = "wait"
    check_interval_s: float = 1.0
    aliases: tuple[str, ...] = ()
    """More names the new version is served under (the fleet's stable model name)."""

    def back_after_s(self) -> float:
        """When an updated replica is first seen serving: the first readiness check at or
        after its load time (one at the update, then one every ``check_interval_s``)."""
        if self.check_interval_s <= 0 or self.load_s <= 0:
            return max(self.load_s, 0.0)
        return math.ceil(self.load_s / self.check_interval_s - 1e-9) * self.check_interval_s


class SimulatedRollout(CoreListener):
    """One rollout over the simulated fleet of ``sim`` (its first router)."""

    def __init__(
        self,
        sim: Simulation,
        control: ControlSurface,
        spec: SimRolloutSpec,
        *,
        capacity: Mapping[str, float] | None = None,
        actor: str = "operator",
        rollout_id: str = "rollout-sim",
    ) -> None:
        """RolloutError (PlanError) as live: a replica out of service, the floor out of reach.
        ``capacity``: each replica's capacity to plan with (the live router's, for a
        prediction); None: the simulated router's learned capacity now."""
        self.sim = sim
        self.core = sim.core
        self.control = control
        self.spec = spec
        self.actor = actor
        self.id = rollout_id
        out = [r.id for r in self.core.pool if r.state is not ReplicaState.ACTIVE]
        if out:
            raise RolloutError(
                f"{out[0]} is {self.core.replica(out[0]).state}; a rollout starts with every "
                "replica in service (undrain or readmit it first)"
            )
        now = sim.clock.now
        self.capacity = (
            {r.id: float(capacity[r.id]) for r in self.core.pool}
            if capacity is not None
            else {r.id: self.core.capacity.estimate(r, now).rate for r in self.core.pool}
        )
        members = [Member(rid, c) for rid, c in self.capacity.items()]
        self.plan: Plan = plan_waves(members, spec.floor, spec.order)
        self.old = {r.id: r.models[0] if r.models else r.config.model for r in self.core.pool}
        self.versions = dict(self.old)
        self.served: dict[str, tuple[str, ...]] = {
            r.id: r.models if r.models else (r.config.model,) for r in self.core.pool
        }
        """What each simulated replica's ``/v1/models`` would list."""
        self.steps = dict.fromkeys(self.plan.order, Step.PENDING)
        self.phase = Phase.RUNNING
        self.wave: int | None = None
        self.requests_moved = 0
        self.waited_for = 0
        self.started_at = now
        self.ended_at: float | None = None
        self._lowest = self._share_now()
        self._waiting_drain = False
        self.meter: RolloutMeter | None = None

    def start(self) -> None:
        """Begin now (the simulator's clock); the waves follow on their own."""
        self.started_at = self.sim.clock.now
        self._lowest = self._share_now()
        self.core.listeners.append(self)
        self.meter = RolloutMeter(self.core)
        self._note(self.actor, "start", f"{self.id}: {self.spec.version}, {self._plan_text()}")
        self._next_wave(0)

    def status(self) -> RolloutStatus:
        return RolloutStatus(
            id=self.id,
            version=self.spec.version,
            phase=self.phase,
            plan=self.plan,
            wave=self.wave,
            steps=dict(self.steps),
            versions=dict(self.versions),
            capacity_now=self._share_now(),
            capacity_lowest=self._lowest,
            requests_moved=self.requests_moved,
            waited_for=self.waited_for,
            error=None,
        )

    def figures(self) -> RolloutFigures | None:
        """What it cost the traffic, by the simulated router's accounting (None before the
        start)."""
        return None if self.meter is None else self.meter.figures(self._lowest)

    # ---- the core's events ------------------------------------------------------------------

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        self._lowest = min(self._lowest, self._share_now())
        if self._waiting_drain:
            self._maybe_drained()

    def _share_now(self) -> float:
        total = sum(self.capacity.values())
        active = sum(
            c
            for rid, c in self.capacity.items()
            if self.core.replica(rid).state is ReplicaState.ACTIVE
        )
        return active / total if total > 0 else 1.0

    # ---- the waves ---------------------------------------------------------------------------

    def _next_wave(self, i: int) -> None:
        if i == len(self.plan.waves):
            self.phase = Phase.DONE
            self.ended_at = self.sim.clock.now
            self.core.listeners.remove(self)
            if self.meter is not None:
                self.meter.close(self.ended_at)
            self._note(ACTOR, "done", f"{self.id}: every replica serves {self.spec.version}")
            return
        self.wave = i
        ids = self.plan.waves[i].replicas
        for rid in ids:
            self.steps[rid] = Step.DRAINING
            self.waited_for += self.core.replica(rid).in_flight
            self.control.apply(Drain(rid), actor=ACTOR)
        if math.isfinite(self.spec.drain_timeout_s):
            self.sim.at(self.sim.clock.now + self.spec.drain_timeout_s, lambda: self._deadline(i))
        self._waiting_drain = True
        self._maybe_drained()

    def _draining(self) -> list[str]:
        assert self.wave is not None
        ids = self.plan.waves[self.wave].replicas
        return [r for r in ids if self.core.replica(r).state is ReplicaState.DRAINING]

    def _maybe_drained(self) -> None:
        if self._draining():
            return
        self._waiting_drain = False
        assert self.wave is not None
        i = self.wave
        for rid in self.plan.waves[i].replicas:
            self.steps[rid] = Step.LOADING
        self.sim.at(self.sim.clock.now + self.spec.back_after_s(), lambda: self._loaded(i))

    def _deadline(self, i: int) -> None:
        if self.wave != i or not self._waiting_drain:
            return
        draining = self._draining()
        held = sum(self.core.replica(r).in_flight for r in draining)
        then = "waiting on" if self.spec.on_drain_timeout == "wait" else "preempting"
        self._note(ACTOR, "drain deadline", f"{', '.join(draining)}: {held} in flight; {then}")
        if self.spec.on_drain_timeout == "wait":
            return
        for rid in draining:
            self.requests_moved += self.core.replica(rid).in_flight
            self.control.apply(Preempt(rid, include_high=True), actor=ACTOR)

    def _loaded(self, i: int) -> None:
        for rid in self.plan.waves[i].replicas:
            self.versions[rid] = self.spec.version
            self.served[rid] = (self.spec.version, *self.spec.aliases)
            self.steps[rid] = Step.UPDATED
            self.control.apply(Undrain(rid), actor=ACTOR)
        self._next_wave(i + 1)

    # ---- the trail ----------------------------------------------------------------------------

    def _note(self, actor: str, step: str, message: str) -> None:
        args = {"rollout": self.id, "step": step, "version": self.spec.version}
        self.control.note(actor, "rollout", args, True, message)

    def _plan_text(self) -> str:
        waves = " | ".join(", ".join(w.replicas) for w in self.plan.waves)
        return (
            f"{len(self.plan.waves)} waves ({waves}), capacity kept >= {self.plan.lowest:.0%} "
            f"(floor {self.spec.floor:.0%})"
        )
