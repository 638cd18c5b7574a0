"""A heap of open replicas by a score that changes only when the replica changes.

Scores that depend only on a replica's own state (in-flight count over weight, outstanding
tokens...) are kept in a binary heap with lazy invalidation: every update pushes a fresh entry
and makes the old one stale. A pick pops stale entries, sets aside replicas that cannot take
this particular request, and puts them back. Both are O(log n); the heap is compacted when
stale entries outnumber live ones, so memory stays O(n).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Iterable

from router.replica import Replica
from router.request import Request

Entry = tuple[float, int, int]  # (score, sequence, replica index)


class ScoreIndex:
    def __init__(self, key: Callable[[Replica], float]) -> None:
        self.key = key
        self._heap: list[Entry] = []
        self._live: dict[int, int] = {}  # replica index -> sequence of its live entry
        self._seq = 0
        # Keyed by replica index, not a list position, so an index may cover a subset of the
        # pool (one tier, say) and still find its replicas by ``Replica.index``.
        self._replicas: dict[int, Replica] = {}

    def rebuild(self, replicas: Iterable[Replica]) -> None:
        self._replicas = {r.index: r for r in replicas}
        self._heap.clear()
        self._live.clear()
        for r in self._replicas.values():
            self.update(r)

    def update(self, r: Replica) -> None:
        if r.has_slot:
            self._seq += 1
            self._live[r.index] = self._seq
            heapq.heappush(self._heap, (self.key(r), self._seq, r.index))
            if len(self._heap) > 4 * len(self._replicas) + 64:
                self._compact()
        else:
            self._live.pop(r.index, None)

    def best(self, request: Request) -> Replica | None:
        """The lowest-scored replica that can take the request."""
        heap, live, replicas = self._heap, self._live, self._replicas
        aside: list[Entry] = []
        found: Replica | None = None
        while heap:
            entry = heap[0]
            if live.get(entry[2]) != entry[1]:
                heapq.heappop(heap)
                continue
            r = replicas[entry[2]]
            if r.can_take(request):
                found = r
                break
            aside.append(heapq.heappop(heap))
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def ascending(self, request: Request) -> Generator[Replica, None, None]:
        """Replicas that can take the request, lowest score first.

        Entries looked at are restored when the iterator is closed (use
        ``contextlib.closing``), so taking the first few costs O(k log n).
        """
        heap, live, replicas = self._heap, self._live, self._replicas
        aside: list[Entry] = []
        try:
            while heap:
                entry = heap[0]
                if live.get(entry[2]) != entry[1]:
                    heapq.heappop(heap)
                    continue
                aside.append(heapq.heappop(heap))
                r = replicas[entry[2]]
                if r.can_take(request):
                    yield r
        finally:
            for entry in aside:
                heapq.heappush(heap, entry)

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._live.get(e[2]) == e[1]]
        heapq.heapify(self._heap)
