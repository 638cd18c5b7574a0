"""The admission queue: bounded, ordered by priority then arrival, with deadlines.

A request leaves the queue exactly once: taken for dispatch, or expired. A full queue refuses
new requests (the front door answers 429). Requests put back after a preemption or a failed
attempt go to the front of their priority class and are not refused for lack of room: they
were admitted once, and refusing them now would lose them.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from router.request import Priority, Request


class AdmissionQueue:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("queue capacity must be at least 1")
        self.capacity = capacity
        # Each admission gets a token, so a request put back after leaving is not confused
        # with the stale entry it left behind in its class.
        self._classes: dict[Priority, deque[tuple[int, Request]]] = {p: deque() for p in Priority}
        self._queued: dict[str, int] = {}
        self._depth = dict.fromkeys(Priority, 0)
        self._deadlines: list[tuple[float, int, Request]] = []
        self._token = 0

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._queued

    @property
    def full(self) -> bool:
        return len(self._queued) >= self.capacity

    def depth_by_priority(self) -> dict[Priority, int]:
        return dict(self._depth)

    def push(self, request: Request) -> bool:
        """Admit a new request at the back of its class; False when the queue is full."""
        if self.full:
            return False
        self._classes[request.priority].append((self._admit(request), request))
        return True

    def push_front(self, request: Request) -> None:
        """Put a request back at the front of its class (after a preemption or retry)."""
        self._classes[request.priority].appendleft((self._admit(request), request))

    def remove(self, request: Request) -> None:
        """Take a request out (dispatched or cancelled); it is skipped where it stood."""
        del self._queued[request.id]
        self._depth[request.priority] -= 1

    def waiting(self) -> Iterator[Request]:
        """Queued requests in service order: priority, then position."""
        queued = self._queued
        for klass in self._classes.values():
            # Requests removed out of order are dropped lazily when they reach the head.
            while klass and queued.get(klass[0][1].id) != klass[0][0]:
                klass.popleft()
            for token, r in klass:
                if queued.get(r.id) == token:
                    yield r

    def expire(self, now: float) -> list[Request]:
        """Remove and return the requests whose deadline has passed."""
        out: list[Request] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, token, r = heapq.heappop(heap)
            if self._queued.get(r.id) == token:
                self.remove(r)
                out.append(r)
        return out

    def next_deadline(self) -> float | None:
        """The earliest deadline still pending (for drivers that schedule a wake-up)."""
        heap = self._deadlines
        while heap and self._queued.get(heap[0][2].id) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _admit(self, request: Request) -> int:
        if request.id in self._queued:
            raise ValueError(f"request {request.id} is already queued")
        self._token += 1
        self._queued[request.id] = self._token
        self._depth[request.priority] += 1
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, self._token, request))
        return self._token
