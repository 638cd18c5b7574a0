"""What a rollout cost the traffic, from the router's own accounting during its window.

A listener on the router core, attached when the rollout starts and told when it ends. It
reads the core's queue at every dispatch, ending and replica state change (the queue only
grows between two of them when nothing can leave it, and the next ending reads it) and the
time to first token of every streamed request that arrived in the window, once it ends (a
request that expired in the queue counts as later than any, as the scenario checks count it;
a non-streamed answer's first byte is the whole answer, no first token, as
``RouterCore.first_byte`` says, so it is counted but not timed). It stays
attached after the window until the requests that arrived in it have all ended, so the p99
is over all of them.

The live rollout and the simulated one measure the same way, so a prediction (the simulator's
meter) and the measurement (the live router's) are the same figures.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from router.core import Assignment, CoreListener, Finished, Outcome, RouterCore
from router.replica import Replica, ReplicaState
from router.stats import percentile

__all__ = ["RolloutFigures", "RolloutMeter"]


@dataclass(frozen=True, slots=True)
class RolloutFigures:
    """A rollout's cost to the traffic: predicted (simulated) or measured (live)."""

    capacity_lowest: float
    """The lowest share of the fleet's capacity in service."""
    peak_queue: int
    """The most requests waiting in the router's queue at once."""
    ttft_p99_s: float | None
    """p99 time to first token of the streamed requests that arrived during the rollout (None:
    none did; infinite when more than 1% never got one)."""
    duration_s: float | None
    """From the start to the last replica back in service (None: not ended)."""
    requests: int
    """Requests that arrived during the rollout (and ended)."""

    def to_dict(self) -> dict[str, Any]:
        p99 = self.ttft_p99_s
        return {
            "capacity_lowest": round(self.capacity_lowest, 4),
            "peak_queue": self.peak_queue,
            "ttft_p99_s": None if p99 is None or math.isinf(p99) else round(p99, 4),
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "requests": self.requests,
        }


class RolloutMeter(CoreListener):
    """The peak queue and the TTFT of the requests that arrived while a rollout ran."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.since = core.clock()
        self.until: float | None = None
        self.peak_queue = len(core.queue)
        self._ttft: list[float] = []
        self._requests = 0
        self._attempts: dict[str, Assignment] = {}
        self.settled = False
        """The window closed and every request that arrived in it ended: the figures are
        final."""
        self._in_event = False
        core.listeners.append(self)

    def close(self, now: float | None = None) -> None:
        """The rollout ended: requests arriving from now on are not its."""
        if self.until is None:
            self.until = self.core.clock() if now is None else now
            self._detach_when_settled()

    def figures(self, capacity_lowest: float) -> RolloutFigures:
        duration = None if self.until is None else self.until - self.since
        return RolloutFigures(
            capacity_lowest,
            self.peak_queue,
            percentile(self._ttft, 0.99),
            duration,
            self._requests,
        )

    # ---- the core's events ------------------------------------------------------------------

    def on_assign(self, assignment: Assignment) -> None:
        if self.settled:
            return
        self._queue()
        if self._in_window(assignment.request.arrival):
            self._attempts[assignment.request.id] = assignment

    def on_finish(self, finished: Finished) -> None:
        if self.settled:
            return
        self._queue()
        attempt = self._attempts.pop(finished.request.id, None)
        if self._in_window(finished.request.arrival):
            self._time(finished, attempt)
        self._in_event = True
        try:
            self._detach_when_settled()
        finally:
            self._in_event = False

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        self._queue()

    def _time(self, finished: Finished, attempt: Assignment | None) -> None:
        if finished.outcome is Outcome.COMPLETED and attempt is not None:
            self._requests += 1
            first = attempt.first_byte
            if first is None:
                self._ttft.append(math.inf)
            elif attempt.first_token:
                self._ttft.append(first - finished.request.arrival)
        elif finished.outcome is Outcome.EXPIRED:
            self._requests += 1
            self._ttft.append(math.inf)

    def _queue(self) -> None:
        if self.until is None:
            self.peak_queue = max(self.peak_queue, len(self.core.queue))

    def _in_window(self, arrival: float) -> bool:
        return arrival >= self.since and (self.until is None or arrival < self.until)

    def _detach_when_settled(self) -> None:
        if self.settled or self.until is None or self._attempts or self._queued_from_window():
            return
        self.settled = True
        # Never off the core's list while the core walks it (that would skip the next
        # listener): inert from now on, and taken off by ``close`` when it is called after.
        if not self._in_event:
            with contextlib.suppress(ValueError):
                self.core.listeners.remove(self)

    def _queued_from_window(self) -> bool:
        return any(self._in_window(r.arrival) for r in self.core.queue.waiting())
