"""What a scenario run saw: every request's ending, every dispatch, one sample per second.

The recorder is a listener on the router core, so the simulator and a live run record the
same things the same way: the router's own view (arrival at the router, first byte from the
replica, the ending it gave the request). Times are converted to scenario seconds by the
``scenario_time`` function the runner passes (the virtual clock as is; live, the monotonic
clock from the start, times the emulator's time scale).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.core import Assignment, CoreListener, Finished, RouterCore
from router.replica import Replica, ReplicaState
from router.request import Priority, Request
from router.snapshot import FleetSnapshot

__all__ = [
    "ActionRecord",
    "CanaryOutcome",
    "Recorder",
    "RequestRecord",
    "RolloutOutcome",
    "Sample",
    "sample_line",
]


@dataclass(slots=True)
class RequestRecord:
    arrival: float
    priority: Priority
    first_byte: float | None = None
    end: float | None = None
    outcome: str | None = None
    """completed, failed, rejected or expired; None while unfinished."""
    replica: str | None = None
    """The replica named by the ending (where it completed or last failed)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one second of scenario time."""

    t: float
    strategy: str
    throughput_rps: float
    """Completions in the second before ``t``."""
    queue_depth: int
    in_flight: int
    imbalance_factor: float
    band: str
    replicas: dict[str, dict[str, Any]]
    """Per replica: state, utilization, in_flight, weight, batch_size."""


@dataclass(frozen=True, slots=True)
class ActionRecord:
    t: float
    line: int
    action: str
    ok: bool
    message: str


@dataclass(frozen=True, slots=True)
class RolloutOutcome:
    """What a scenario's rollout step did, read when the run's drain ended."""

    version: str
    started_at: float
    """Scenario seconds when the router accepted it."""
    ended_at: float | None
    """Scenario seconds when it ended (done, failed, aborted); None: still going at the end."""
    status: dict[str, Any]
    """The rollout's own status (router/rollout/executor.py's ``RolloutStatus.to_dict``)."""
    served: dict[str, tuple[str, ...] | None]
    """What each replica's ``/v1/models`` listed at the end; None: it did not answer."""
    traffic: dict[str, Any] | None = None
    """What it cost the traffic by the router's own accounting (router/rollout/meter.py's
    ``RolloutFigures.to_dict``); None when not measured."""
    prediction: dict[str, Any] | None = None
    """What the router predicted before it started (router/rollout/predict.py), if it did."""

    @property
    def phase(self) -> str:
        return str(self.status["phase"])

    @property
    def capacity_lowest(self) -> float:
        return float(self.status["capacity_lowest"])

    @property
    def behind(self) -> list[str]:
        """Replicas not on the new version at the end: by the rollout's account (last seen
        serving) or by their own ``/v1/models``; both must name it."""
        seen = self.status["versions"]
        return sorted(
            rid
            for rid, models in self.served.items()
            if seen.get(rid) != self.version or models is None or self.version not in models
        )

    def to_dict(self) -> dict[str, Any]:
        ended = self.ended_at
        return {
            "version": self.version,
            "phase": self.phase,
            "started_at": round(self.started_at, 3),
            "ended_at": None if ended is None else round(ended, 3),
            "duration_s": None if ended is None else round(ended - self.started_at, 3),
            # Shares of the capacity in service at the start (all of it: a rollout starts
            # with every replica active).
            "capacity_lowest": round(self.capacity_lowest, 4),
            "capacity_planned_lowest": round(float(self.status["plan"]["lowest"]), 4),
            "behind": self.behind,
            "requests_moved": self.status["requests_moved"],
            "waited_for": self.status["waited_for"],
            "error": self.status["error"],
            "waves": [w["replicas"] for w in self.status["plan"]["waves"]],
        }


@dataclass(frozen=True, slots=True)
class CanaryOutcome:
    """What a scenario's canary step did, read when the run's drain ended."""

    version: str
    started_at: float
    ended_at: float | None
    """Scenario seconds when it ended (promoted, rolled back, ...); None: still going."""
    status: dict[str, Any]
    """The canary's own status (router/rollout/canary.py's ``Canary.status``)."""
    served: dict[str, tuple[str, ...] | None]
    """What each replica's ``/v1/models`` listed at the end; None: it did not answer."""
    rolled_back_at: float | None = None
    """Scenario seconds when the split went back to 0% for a rollback (the judge's verdict,
    or an abort); None: it did not."""

    @property
    def phase(self) -> str:
        return str(self.status["phase"])

    @property
    def share(self) -> float:
        return float(self.status["share"])

    @property
    def on_new(self) -> list[str]:
        """Replicas whose own ``/v1/models`` lists the new version first (their version)."""
        return sorted(rid for rid, ms in self.served.items() if ms and ms[0] == self.version)

    def to_dict(self) -> dict[str, Any]:
        ended = self.ended_at
        return {
            "version": self.version,
            "phase": self.phase,
            "started_at": round(self.started_at, 3),
            "ended_at": None if ended is None else round(ended, 3),
            "rolled_back_at": None
            if self.rolled_back_at is None
            else round(self.rolled_back_at, 3),
            "share": self.share,
            "on_new": self.on_new,
            "figures": self.status["figures"],
            "verdict": self.status["verdict"],
            "judged": self.status["judged"],
            "error": self.status["error"],
        }


@dataclass(slots=True)
class Recorder(CoreListener):
    core: RouterCore
    scenario_time: Callable[[float], float]
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    dispatches: list[tuple[float, str]] = field(default_factory=list)
    """(time, replica id) of every attempt started, in time order."""
    states: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """Per replica, (time, state) from the start: the state is the last entry at or before t."""
    samples: list[Sample] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)
    """End times of completed requests, in order."""
    rollout: RolloutOutcome | None = None
    """Runs with a rollout step: what it did (set by the runner at the end)."""
    canary: CanaryOutcome | None = None
    """Runs with a canary step: what it did (set by the runner at the end)."""
    _attempts: dict[str, Assignment] = field(default_factory=dict)
    _finished: bool = False

    def __post_init__(self) -> None:
        for r in self.core.pool:
            self.states[r.id] = [(0.0, str(r.state))]
        self.core.listeners.append(self)

    def now(self) -> float:
        return self.scenario_time(self.core.clock())

    # ---- core listener ---------------------------------------------------------------------

    def on_assign(self, assignment: Assignment) -> None:
        self._record(assignment.request)
        self._attempts[assignment.request.id] = assignment
        self.dispatches.append((self.now(), assignment.replica.id))

    def on_finish(self, finished: Finished) -> None:
        rec = self._record(finished.request)
        self._note_first_byte(rec, self._attempts.pop(finished.request.id, None))
        rec.end = self.scenario_time(finished.time)
        rec.outcome = str(finished.outcome)
        rec.replica = finished.replica
        if finished.outcome == "completed":
            self.completions.append(rec.end)

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        self.states[replica.id].append((self.now(), str(replica.state)))

    def finish(self) -> None:
        """At the end of the run: note the requests still queued and the first bytes of those
        still running, and stop listening (what happens next, such as a shutdown cancelling
        what is left, is not part of the run)."""
        if self._finished:
            return
        self._finished = True
        self.core.listeners.remove(self)
        for request in self.core.queue.waiting():
            self._record(request)
        for request_id, assignment in self._attempts.items():
            self._note_first_byte(self.requests[request_id], assignment)

    def _note_first_byte(self, rec: RequestRecord, assignment: Assignment | None) -> None:
        # The core's first-byte time lives on the attempt; the last attempt is the one that
        # produced it (a re-run after preemption starts from nothing).
        if assignment is not None and assignment.first_byte is not None and rec.first_byte is None:
            rec.first_byte = self.scenario_time(assignment.first_byte)

    def _record(self, request: Request) -> RequestRecord:
        rec = self.requests.get(request.id)
        if rec is None:
            rec = RequestRecord(self.scenario_time(request.arrival), request.priority)
            self.requests[request.id] = rec
        return rec

    # ---- samples ---------------------------------------------------------------------------

    def sample(self, t: float) -> Sample:
        """Record the fleet now, labelled with scenario time ``t``."""
        snap = self.core.snapshot()
        done = bisect.bisect_right(self.completions, t) - bisect.bisect_right(
            self.completions, t - 1.0
        )
        sample = _sample(snap, t, float(done))
        self.samples.append(sample)
        return sample

    def state_at(self, replica: str, t: float) -> str:
        history = self.states[replica]
        i = bisect.bisect_right([when for when, _ in history], t) - 1
        return history[max(i, 0)][1]


def _sample(snap: FleetSnapshot, t: float, throughput: float) -> Sample:
    return Sample(
        t=round(t, 3),
        strategy=snap.strategy,
        throughput_rps=throughput,
        queue_depth=snap.queue.depth,
        in_flight=snap.in_flight,
        imbalance_factor=round(snap.imbalance_factor, 4),
        band=str(snap.band),
        replicas={
            r.id: {
                "state": r.state,
                "utilization": round(r.utilization, 4),
                "in_flight": r.in_flight,
                "weight": r.weight,
                "batch_size": r.batch_size,
            }
            for r in snap.replicas
        },
    )


def sample_line(sample: Sample) -> dict[str, Any]:
    """The JSON object printed for one sample."""
    return {
        "kind": "sample",
        "t": sample.t,
        "strategy": sample.strategy,
        "throughput_rps": sample.throughput_rps,
        "queue_depth": sample.queue_depth,
        "in_flight": sample.in_flight,
        "imbalance_factor": sample.imbalance_factor,
        "band": sample.band,
        "replicas": sample.replicas,
    }
