"""The rollout executor: one asyncio task that runs a plan of waves on a live router.

For each wave: drain its replicas (the control surface's ``drain``, given the way an
operator's command is given here, router/rollout/command_path.py: the trail shows it like an
operator's, and where the router publishes commands every router and worker applies it),
wait until nothing is in flight on them (here, in the sibling workers' load table and in the
other routers' last reports; past ``drain_timeout_s`` the operator's choice applies:
``preempt`` frees them now, ``wait`` waits on), run the updater on each, wait until each
serves the new version (its ``/v1/models`` names it and a one-token generation succeeds,
router/rollout/probe.py), tell the router what it now serves, and undrain it. Every step is
an audit event of kind ``rollout``.

- **pause** takes effect between waves, when every replica of the last wave is back in
  service; **resume** goes on with the next.
- **abort** stops after the current step: a wave still draining is undrained at once (nothing
  was changed on it); an update already started is seen through (its command is never killed
  half-way by an abort) and its replica readmitted; no further wave starts.
- **failure**: an update that fails or times out, or a replica that does not serve the new
  version within ``ready_timeout_s``, stops the rollout with the reason. That replica is
  readmitted if it still serves its old version, else left drained and flagged; the rest of
  its wave is readmitted on whatever version it verifiably serves. The fleet is left serving.
- **rollback** (after the rollout ended, failed or was aborted; a running one is aborted
  first) runs the updater back to each replica's old version, flagged replicas first (they
  are out already), then the updated ones in waves planned against the same floor.

The state and progress (:meth:`Rollout.status`) say which replica is at which step, the share
of capacity in service now and at its lowest, and how many requests the rollout moved.
Capacity is each replica's learned rate when the rollout was planned (router/capacity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal

from router.clock import Clock, monotonic
from router.config.schema import RolloutConfig
from router.control import ControlSurface, Drain, Preempt, Undrain
from router.core import CoreListener, RouterCore
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.rollout.command_path import CommandPath
from router.rollout.plan import Member, Order, Plan, plan_waves
from router.rollout.probe import ServingProbe
from router.rollout.updaters import Target, Updater, UpdateResult

__all__ = ["Phase", "Rollout", "RolloutSpec", "RolloutStatus", "Step"]

ACTOR = "rollout"
"""The actor of the steps the executor takes itself."""
_OUTPUT_IN_EVENT = 400
"""Characters of an updater's output an audit event carries (its tail)."""
_OTHERS_POLL_S = 0.05
"""How often a drained replica is looked at again while requests of other workers or routers
still run there (nothing tells this router when those end; the load table is read as often)."""
_ids = itertools.count(1)


class Phase(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"
    ROLLING_BACK = "rolling back"
    ROLLED_BACK = "rolled back"
    ROLLBACK_FAILED = "rollback failed"


_ENDED = frozenset(
    {Phase.DONE, Phase.FAILED, Phase.ABORTED, Phase.ROLLED_BACK, Phase.ROLLBACK_FAILED}
)


class Step(StrEnum):
    PENDING = "pending"
    DRAINING = "draining"
    UPDATING = "updating"
    LOADING = "loading"
    """The updater ran; waiting for the replica to serve the new version."""
    UPDATED = "updated"
    """Serves the new version, back in service."""
    KEPT = "kept"
    """Back in service on its old version (its update failed, or the rollout was aborted)."""
    FLAGGED = "flagged"
    """Its update failed and it does not serve its old version either: left drained."""
    ROLLED_BACK = "rolled back"


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What to roll out and how."""

    version: str
    updater: Updater
    floor: float = 0.75
    order: Order = "weakest-first"
    drain_timeout_s: float = 300.0
    on_drain_timeout: Literal["wait", "preempt"] = "wait"
    ready_timeout_s: float = 900.0
    check_interval_s: float = 1.0
    replicas: tuple[str, ...] | None = None
    """Only these replicas (a canary's); None: the whole fleet. The rest of the fleet's
    capacity in service counts toward the floor."""

    @classmethod
    def from_config(
        cls, config: RolloutConfig, version: str, updater: Updater, **overrides: Any
    ) -> RolloutSpec:
        """The fleet file's defaults, with the rollout command's own settings over them."""
        choice: Literal["wait", "preempt"] = (
            "preempt" if config.on_drain_timeout == "preempt" else "wait"
        )
        order: Order = "strongest-first" if config.order == "strongest-first" else "weakest-first"
        spec = cls(
            version,
            updater,
            floor=config.floor,
            order=order,
            drain_timeout_s=config.drain_timeout_s,
            on_drain_timeout=choice,
            ready_timeout_s=config.ready_timeout_s,
            check_interval_s=config.check_interval_s,
        )
        return replace(spec, **overrides)


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """A rollout's state and progress at one instant."""

    id: str
    version: str
    phase: Phase
    plan: Plan
    wave: int | None
    """Index of the wave under way or last done (None before the first)."""
    steps: dict[str, Step]
    versions: dict[str, str]
    """What each replica was last seen serving (its old version until verified)."""
    capacity_now: float
    """Share of the fleet's capacity in service now."""
    capacity_lowest: float
    """The lowest share in service since the rollout started."""
    requests_moved: int
    """Requests a preemption took off a draining replica (re-queued, or ended if streaming)."""
    waited_for: int
    """Requests in flight on replicas when they were drained, left to finish there."""
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "phase": str(self.phase),
            "plan": self.plan.to_dict(),
            "wave": self.wave,
            "steps": {r: str(s) for r, s in self.steps.items()},
            "versions": dict(self.versions),
            "capacity_now": self.capacity_now,
            "capacity_lowest": self.capacity_lowest,
            "requests_moved": self.requests_moved,
            "waited_for": self.waited_for,
            "error": self.error,
        }


class Rollout(CoreListener):
    """One rollout of one version over the whole fleet of ``core``."""

    def __init__(
        self,
        spec: RolloutSpec,
        core: RouterCore,
        control: ControlSurface,
        probe: ServingProbe,
        *,
        actor: str = "operator",
        learn: Callable[[Replica, tuple[str, ...]], object] | None = None,
        clock: Clock = monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
        path: CommandPath | None = None,
    ) -> None:
        """RolloutError (PlanError) when the plan cannot be made: a replica out of service,
        the floor out of reach. ``learn``: told what a replica serves once verified, before it
        is readmitted (the server passes ``ServedModels.learn``, so that no request for the
        old name is sent to it); ``actor``: who started it; ``path``: how its drains and
        readmissions are given (the manager's; by default applied on this router alone)."""
        self.spec = spec
        self.core = core
        self.control = control
        self.path = path if path is not None else CommandPath(control)
        self.probe = probe
        self.actor = actor
        self.learn = learn
        self.clock = clock
        self._sleep = sleep
        self.id = f"rollout-{next(_ids)}"
        ids = [r.id for r in core.pool] if spec.replicas is None else list(spec.replicas)
        unknown = [rid for rid in ids if rid not in core.pool.by_id]
        if unknown or not ids:
            raise RolloutError(f"no replica {unknown[0]!r}" if unknown else "no replica to roll")
        out = [rid for rid in ids if core.replica(rid).state is not ReplicaState.ACTIVE]
        if out:
            raise RolloutError(
                f"{out[0]} is {core.replica(out[0]).state}; a rollout starts with every "
                "replica in service (undrain or readmit it first)"
            )
        now = clock()
        self.capacity = {r.id: core.capacity.estimate(r, now).rate for r in core.pool}
        members = [Member(rid, self.capacity[rid]) for rid in ids]
        staying = sum(
            c
            for rid, c in self.capacity.items()
            if rid not in ids and core.replica(rid).state is ReplicaState.ACTIVE
        )
        self.plan = plan_waves(members, spec.floor, spec.order, staying=staying)
        self.old = {rid: _first_name(core.replica(rid)) for rid in ids}
        self.versions = dict(self.old)
        self.steps = dict.fromkeys(self.plan.order, Step.PENDING)
        self.phase = Phase.RUNNING
        self.wave: int | None = None
        self.error: str | None = None
        self.requests_moved = 0
        self.waited_for = 0
        self._lowest = self._share_now()
        self._running_ok = asyncio.Event()
        self._running_ok.set()
        self._aborting = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- the operator's commands -----------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Begin; the task ends when the rollout does (never with an exception of its own)."""
        if self._task is not None:
            raise RolloutError(f"{self.id} has already started")
        self._note(self.actor, "start", True, self._plan_text(), plan=self.plan.to_dict())
        self._task = asyncio.create_task(self._guarded(self._roll()), name=self.id)
        return self._task

    def pause(self, actor: str = "operator") -> str:
        if self.phase is not Phase.RUNNING:
            raise RolloutError(f"{self.id} is {self.phase}; only a running rollout pauses")
        self.phase = Phase.PAUSED
        self._running_ok.clear()
        return self._note(actor, "pause", True, f"{self.id}: pauses after the current wave")

    def resume(self, actor: str = "operator") -> str:
        if self.phase is not Phase.PAUSED:
            raise RolloutError(f"{self.id} is {self.phase}, not paused")
        self.phase = Phase.RUNNING
        self._running_ok.set()
        return self._note(actor, "resume", True, f"{self.id}: resumed")

    def abort(self, actor: str = "operator") -> str:
        if self.phase not in (Phase.RUNNING, Phase.PAUSED, Phase.ROLLING_BACK):
            raise RolloutError(f"{self.id} is {self.phase}; there is nothing to abort")
        self._aborting.set()
        self._running_ok.set()  # a paused rollout wakes to stop
        return self._note(actor, "abort", True, f"{self.id}: stops after the current step")

    async def rollback(self, actor: str = "operator") -> asyncio.Task[None]:
        """Abort if it is still going, then move every updated (or flagged) replica back to
        its old version; the task that does it."""
        if self.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK):
            raise RolloutError(f"{self.id} is {self.phase} already")
        if self.phase not in _ENDED:
            self.abort(actor)
        if self._task is not None:
            await self._task
        targets = [r for r, s in self.steps.items() if s in (Step.UPDATED, Step.FLAGGED)]
        self._aborting.clear()
        self.phase = Phase.ROLLING_BACK
        self.error = None
        self._note(actor, "rollback", True, f"{self.id}: back to the old version on {len(targets)}")
        self._task = asyncio.create_task(self._guarded(self._roll_back(targets)), name=self.id)
        return self._task

    async def cancel(self) -> None:
        """Stop now, whatever the step (the router is stopping); the task is awaited."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait(self) -> RolloutStatus:
        """The status once the current task (rollout or rollback) has ended."""
        if self._task is not None:
            await self._task
        return self.status()

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
            error=self.error,
        )

    # ---- the core's events ------------------------------------------------------------------

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        self._lowest = min(self._lowest, self._share_now())
        self._changed.set()

    def _share_now(self) -> float:
        total = sum(self.capacity.values())
        active = sum(
            c
            for rid, c in self.capacity.items()
            if self.core.replica(rid).state is ReplicaState.ACTIVE
        )
        return active / total if total > 0 else 1.0

    # ---- the task ---------------------------------------------------------------------------

    async def _guarded(self, body: Any) -> None:
        """Run ``body`` as the core's listener; whatever ends it, the fleet is left serving."""
        self.core.listeners.append(self)
        try:
            await body
        except Exception as exc:  # a bug must not leave replicas drained with no word
            self.error = f"{type(exc).__name__}: {exc}"
            self.phase = Phase.ROLLBACK_FAILED if self.phase is Phase.ROLLING_BACK else Phase.FAILED
            self._note(ACTOR, "stopped", False, f"{self.id}: stopped on an error: {self.error}")
            await self._undrain(self._drained_unchanged(), "stopped on an error")
        finally:
            with contextlib.suppress(ValueError):
                self.core.listeners.remove(self)

    async def _roll(self) -> None:
        for i, wave in enumerate(self.plan.waves):
            await self._running_ok.wait()
            if self._aborting.is_set():
                break
            self.wave = i
            if not await self._wave(wave.replicas, self.spec.version, Step.UPDATED):
                self.phase = Phase.FAILED
                self._note(ACTOR, "failed", False, f"{self.id}: stopped: {self.error}")
                return
        if self._aborting.is_set():
            self.phase = Phase.ABORTED
            self._note(ACTOR, "aborted", True, f"{self.id}: aborted; {self._summary()}")
            return
        self.phase = Phase.DONE
        self._note(ACTOR, "done", True, f"{self.id}: every replica serves {self.spec.version}")

    async def _roll_back(self, targets: Sequence[str]) -> None:
        flagged = [r for r in targets if self.steps[r] is Step.FLAGGED]
        updated = [r for r in targets if self.steps[r] is Step.UPDATED]
        ok = True
        if flagged:  # already out of service: no capacity to plan for
            ok = await self._wave(flagged, None, Step.ROLLED_BACK)
        if ok and updated:
            staying = sum(c for r, c in self.capacity.items() if r not in updated)
            members = [Member(r, self.capacity[r]) for r in reversed(updated)]
            order = tuple(m.id for m in members)
            plan = plan_waves(members, self.spec.floor, order, staying=staying)
            for wave in plan.waves:
                if self._aborting.is_set() or not ok:
                    break
                ok = await self._wave(wave.replicas, None, Step.ROLLED_BACK)
        self.phase = Phase.ROLLED_BACK if ok else Phase.ROLLBACK_FAILED
        message = f"{self.id}: rolled back" if ok else f"{self.id}: rollback stopped: {self.error}"
        self._note(ACTOR, "rolled back" if ok else "failed", ok, message)

    async def _wave(self, ids: Sequence[str], version: str | None, done: Step) -> bool:
        """Drain, update, verify and readmit ``ids``; ``version`` None means each one's old
        version. False when one of them failed (the rest readmitted, ``error`` says why)."""
        to_drain = [r for r in ids if self.core.replica(r).state is ReplicaState.ACTIVE]
        for rid in to_drain:
            self.steps[rid] = Step.DRAINING
            self.waited_for += self.core.replica(rid).in_flight
            event = await self.path.run(Drain(rid), ACTOR)
            if not event.ok:
                self.error = event.message
                await self._undrain(self._drained_unchanged(), "its wave could not be drained")
                return False
        if not await self._drained(ids):
            await self._undrain(self._drained_unchanged(), "the rollout was aborted")
            return True
        outcomes = await asyncio.gather(
            *(self._update(rid, version or self.old[rid]) for rid in ids)
        )
        for rid, ok in zip(ids, outcomes, strict=True):
            if ok:
                await self._readmit(rid, done)
            else:
                await self._recover(rid, version or self.old[rid])
        return all(outcomes)

    async def _drained(self, ids: Sequence[str]) -> bool:
        """Wait until none of ``ids`` holds a request, this router's or another worker's or
        router's; False if the rollout was aborted."""
        deadline = self.clock() + self.spec.drain_timeout_s
        while held := self._held(ids):
            if self._aborting.is_set():
                return False
            left = deadline - self.clock()
            if left <= 0:
                await self._drain_deadline(ids)
                deadline = math.inf
                continue
            self._changed.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._changed, self._aborting)]
            timeout = None if math.isinf(left) else left
            if any(self.core.replica(r).state is not ReplicaState.DRAINING for r in held):
                # Drained here, not elsewhere: no event says when the others' requests end.
                timeout = _OTHERS_POLL_S if timeout is None else min(timeout, _OTHERS_POLL_S)
            _, pending = await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
            for w in pending:
                w.cancel()
        return True

    def _held(self, ids: Iterable[str]) -> list[str]:
        """Those of ``ids`` still draining here, or out of service here with requests of
        sibling workers (the load table) or other routers (their last reports) on them."""
        held = []
        for rid in ids:
            r = self.core.replica(rid)
            if r.state is ReplicaState.DRAINING or (
                r.state is not ReplicaState.ACTIVE and r.in_flight > 0
            ):
                held.append(rid)
        return held

    async def _drain_deadline(self, ids: Iterable[str]) -> None:
        draining = self._held(ids)
        held = sum(self.core.replica(r).in_flight for r in draining)
        choice = self.spec.on_drain_timeout
        then = "waiting on" if choice == "wait" else "preempting"
        message = f"{', '.join(draining)}: {held} in flight after the drain deadline; {then}"
        self._note(ACTOR, "drain deadline", True, message, replicas=draining)
        if choice == "wait":
            return
        for rid in draining:
            self.requests_moved += self.core.replica(rid).in_flight
            await self.path.run(Preempt(rid, include_high=True), ACTOR)

    async def _update(self, rid: str, version: str) -> bool:
        """Run the updater on ``rid`` and wait until it serves ``version``."""
        r = self.core.replica(rid)
        target = Target(rid, r.config.node, r.config.endpoint, version)
        self.steps[rid] = Step.UPDATING
        self._note(
            ACTOR, "update", True, f"{rid}: {self.spec.updater.describe(target)}", replica=rid
        )
        result = await self.spec.updater.update(target)
        self._note_result(rid, result)
        if not result.ok:
            self.error = f"{rid}: the update failed: {result.summary}"
            return False
        self.steps[rid] = Step.LOADING
        timeout_s = self.spec.ready_timeout_s
        problem = await self._serving(rid, version, timeout_s)
        if problem is not None:
            self.error = f"{rid}: does not serve {version} after {timeout_s:g} s: {problem}"
        return problem is None

    async def _serving(self, rid: str, version: str, timeout_s: float) -> str | None:
        """Ask until ``rid`` serves ``version`` or ``timeout_s`` passed (0: ask once); None
        when it does, else why not at the last ask."""
        url = self.core.replica(rid).config.endpoint
        deadline = self.clock() + timeout_s
        while True:
            serving = await self.probe.check(url, version)
            if serving.problem is None and serving.models is not None:
                self.versions[rid] = version
                if self.learn is not None:
                    self.learn(self.core.replica(rid), serving.models)
                self._note(ACTOR, "serving", True, f"{rid}: serves {version}", replica=rid)
                return None
            left = deadline - self.clock()
            if left <= 0:
                return serving.problem or "no model list"
            await self._sleep(min(self.spec.check_interval_s, left))

    async def _recover(self, rid: str, wanted: str) -> None:
        """After a failed update: back in service on the version it had, or flagged."""
        before = self.versions[rid]
        self._note(
            ACTOR, "update failed", False, self.error or f"{rid}: update failed", replica=rid
        )
        if before != wanted and await self._serving(rid, before, 0.0) is None:
            await self._readmit(rid, Step.KEPT if before == self.old[rid] else Step.UPDATED)
            return
        self.steps[rid] = Step.FLAGGED
        message = f"{rid}: left drained: it serves neither {wanted} nor {before}"
        self._note(ACTOR, "flagged", False, message, replica=rid)

    async def _readmit(self, rid: str, step: Step) -> None:
        self.steps[rid] = step
        if self.core.replica(rid).state in (ReplicaState.DRAINING, ReplicaState.DRAINED):
            await self.path.run(Undrain(rid), ACTOR)

    def _drained_unchanged(self) -> list[str]:
        return [r for r, s in self.steps.items() if s is Step.DRAINING]

    async def _undrain(self, ids: Iterable[str], why: str) -> None:
        for rid in ids:
            self._note(
                ACTOR, "readmit", True, f"{rid}: back in service unchanged ({why})", replica=rid
            )
            self.steps[rid] = Step.KEPT if self.versions[rid] == self.old[rid] else Step.UPDATED
            await self._readmit(rid, self.steps[rid])

    # ---- the trail --------------------------------------------------------------------------

    def _note(self, actor: str, step: str, ok: bool, message: str, **args: Any) -> str:
        self.control.note(
            actor,
            "rollout",
            {"rollout": self.id, "step": step, "version": self.spec.version, **args},
            ok,
            message,
        )
        return message

    def _note_result(self, rid: str, result: UpdateResult) -> None:
        message = f"{rid}: {result.summary} in {result.seconds:.1f} s"
        output = result.output[-_OUTPUT_IN_EVENT:]
        self._note(
            ACTOR,
            "updated" if result.ok else "update failed",
            result.ok,
            message,
            replica=rid,
            output=output,
        )

    def _plan_text(self) -> str:
        waves = " | ".join(", ".join(w.replicas) for w in self.plan.waves)
        return (
            f"{self.id}: {self.spec.version} in {len(self.plan.waves)} waves ({waves}), "
            f"capacity kept >= {self.plan.lowest:.0%} (floor {self.spec.floor:.0%})"
        )

    def _summary(self) -> str:
        counts: dict[str, int] = {}
        for step in self.steps.values():
            counts[str(step)] = counts.get(str(step), 0) + 1
        return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _first_name(r: Replica) -> str:
    """The name a replica is moved back to on a rollback: the first it serves (its version)."""
    return r.models[0] if r.models else r.config.model
