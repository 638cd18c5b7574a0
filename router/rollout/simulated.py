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

A rollout may cover some replicas only (``SimRolloutSpec.replicas``: a canary's, as live),
the rest of the fleet's capacity in service counting toward the floor, and a rollout that is
done may be **rolled back** (:meth:`SimulatedRollout.rollback`): its updated replicas back to
their old version in waves planned against the same floor, as the live executor's rollback.
Each update is the simulator's version switch (``Simulation.switch_version``: what the engine
serves, which faults set for a version follow) and, as live, the router is told what the
replica now serves before it is readmitted.

Everything happens in callbacks of the simulator's clock (``Simulation.at``) and the core's
state events, so it is as deterministic as the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
    replicas: tuple[str, ...] | None = None
    """Only these replicas (a canary's); None: the whole fleet. The rest of the fleet's
    capacity in service counts toward the floor, as live."""

    def back_after_s(self) -> float:
        """When an updated replica is first seen serving: the first readiness check at or
        after its load time (one at the update, then one every ``check_interval_s``)."""
        if self.check_interval_s <= 0 or self.load_s <= 0:
            return max(self.load_s, 0.0)
        return math.ceil(self.load_s / self.check_interval_s - 1e-9) * self.check_interval_s


@dataclass(slots=True)
class _Pass:
    """Waves run one after the other: the rollout's plan, or its rollback's."""

    waves: tuple[tuple[str, ...], ...]
    version: Callable[[str], str]
    """The version each replica is moved to."""
    done: Step
    """Each replica's step once it is back."""
    finish: Callable[[], None]
    """Called once the last wave is back."""
    index: int = 0


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
        ids = [r.id for r in self.core.pool] if spec.replicas is None else list(spec.replicas)
        unknown = [rid for rid in ids if rid not in self.core.pool.by_id]
        if unknown or not ids:
            raise RolloutError(f"no replica {unknown[0]!r}" if unknown else "no replica to roll")
        out = [rid for rid in ids if self.core.replica(rid).state is not ReplicaState.ACTIVE]
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
        members = [Member(rid, self.capacity[rid]) for rid in ids]
        staying = sum(
            c
            for rid, c in self.capacity.items()
            if rid not in ids and self.core.replica(rid).state is ReplicaState.ACTIVE
        )
        self.plan: Plan = plan_waves(members, spec.floor, spec.order, staying=staying)
        self.old = {rid: _first_name(self.core.replica(rid)) for rid in ids}
        self.versions = dict(self.old)
        self.served: dict[str, tuple[str, ...]] = {
            rid: sim.served[self.core.replica(rid).index] for rid in ids
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
        self._pass: _Pass | None = None
        self._then: Callable[[], None] | None = None

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Begin now (the simulator's clock); the waves follow on their own, and ``then`` is
        called once it is done."""
        self.started_at = self.sim.clock.now
        self._lowest = self._share_now()
        self.core.listeners.append(self)
        self.meter = RolloutMeter(self.core)
        self._note(self.actor, "start", f"{self.id}: {self.spec.version}, {self._plan_text()}")
        self._then = then
        waves = tuple(w.replicas for w in self.plan.waves)
        self._pass = _Pass(waves, lambda _: self.spec.version, Step.UPDATED, self._done)
        self._next_wave(0)

    def rollback(self, actor: str = "operator", then: Callable[[], None] | None = None) -> None:
        """Move every updated replica back to its old version (a rollout that is done: the
        simulated one never fails), in waves planned against the same floor with the rest of
        the fleet counted in, as the live executor's rollback; ``then`` once they are back."""
        if self.phase is not Phase.DONE:
            raise RolloutError(
                f"{self.id} is {self.phase}; a simulated rollout rolls back once done"
            )
        targets = [rid for rid, step in self.steps.items() if step is Step.UPDATED]
        self.phase = Phase.ROLLING_BACK
        self._note(actor, "rollback", f"{self.id}: back to the old version on {len(targets)}")
        staying = sum(c for rid, c in self.capacity.items() if rid not in targets)
        members = [Member(rid, self.capacity[rid]) for rid in reversed(targets)]
        plan = plan_waves(members, self.spec.floor, tuple(m.id for m in members), staying=staying)
        self.core.listeners.append(self)
        self._then = then
        waves = tuple(w.replicas for w in plan.waves)
        self._pass = _Pass(waves, self.old.__getitem__, Step.ROLLED_BACK, self._rolled_back)
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
        p = self._pass
        assert p is not None
        p.index = i
        if i == len(p.waves):
            p.finish()
            return
        if p.done is Step.UPDATED:
            self.wave = i
        for rid in p.waves[i]:
            r = self.core.replica(rid)
            if r.state is not ReplicaState.ACTIVE:
                continue  # out already (ejected): updated as it is, as live
            self.steps[rid] = Step.DRAINING
            self.waited_for += r.in_flight
            self.control.apply(Drain(rid), actor=ACTOR)
        if math.isfinite(self.spec.drain_timeout_s):
            self.sim.at(
                self.sim.clock.now + self.spec.drain_timeout_s, lambda: self._deadline(p, i)
            )
        self._waiting_drain = True
        self._maybe_drained()

    def _draining(self) -> list[str]:
        p = self._pass
        assert p is not None
        return [r for r in p.waves[p.index] if self.core.replica(r).state is ReplicaState.DRAINING]

    def _maybe_drained(self) -> None:
        if self._draining():
            return
        self._waiting_drain = False
        p = self._pass
        assert p is not None
        i = p.index
        for rid in p.waves[i]:
            self.steps[rid] = Step.LOADING
        self.sim.at(self.sim.clock.now + self.spec.back_after_s(), lambda: self._loaded(p, i))

    def _deadline(self, p: _Pass, i: int) -> None:
        if self._pass is not p or p.index != i or not self._waiting_drain:
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

    def _loaded(self, p: _Pass, i: int) -> None:
        for rid in p.waves[i]:
            self._switch(rid, p.version(rid))
            self.steps[rid] = p.done
            if self.core.replica(rid).state in (ReplicaState.DRAINING, ReplicaState.DRAINED):
                self.control.apply(Undrain(rid), actor=ACTOR)
        self._next_wave(i + 1)

    def _switch(self, rid: str, version: str) -> None:
        """The replica's engine serves ``version`` now, and the router is told, before it is
        readmitted (as live: no request for a name it dropped is sent to it)."""
        r = self.core.replica(rid)
        self.sim.switch_version(rid, version, self.spec.aliases)
        served = self.sim.served[r.index]
        self.served[rid] = served
        self.versions[rid] = version
        if r.served_models != served:
            r.served_models = served
            self.core.pool.changed(r)

    def _done(self) -> None:
        self.phase = Phase.DONE
        self._ended()
        if self.meter is not None:
            self.meter.close(self.sim.clock.now)
        self._note(ACTOR, "done", f"{self.id}: every replica serves {self.spec.version}")
        self._call_then()

    def _rolled_back(self) -> None:
        self.phase = Phase.ROLLED_BACK
        self._ended()
        self._note(ACTOR, "rolled back", f"{self.id}: rolled back")
        self._call_then()

    def _ended(self) -> None:
        self.ended_at = self.sim.clock.now
        if self in self.core.listeners:
            self.core.listeners.remove(self)

    def _call_then(self) -> None:
        then, self._then = self._then, None
        if then is not None:
            then()

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


def _first_name(r: Replica) -> str:
    """The version a replica goes back to on a rollback: the first name it serves."""
    return r.models[0] if r.models else r.config.model
