"""The set of replicas, with an index of the ones that have a free slot.

Every change to a replica's load, weight or state goes through :meth:`ReplicaPool.changed`,
which keeps the index true and tells the active strategy, so strategies can keep their own
indexes (heaps, rings) current and pick in O(log n) instead of scanning the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from router.config.schema import ReplicaConfig
from router.replica import Replica


class ReplicaPool:
    def __init__(self, configs: Sequence[ReplicaConfig]) -> None:
        self.replicas: list[Replica] = [
            Replica(
                index=i,
                config=c,
                weight=c.weight,
                batch_size=c.batch_size,
                speed=c.weight,
                kv_limit=c.kv_capacity_tokens,
                kv_tokens=c.kv_capacity_tokens,
            )
            for i, c in enumerate(configs)
        ]
        self.by_id: dict[str, Replica] = {r.id: r for r in self.replicas}
        self._open: list[int] = []
        self._open_pos: dict[int, int] = {}
        self.listener: Callable[[Replica], None] | None = None
        for r in self.replicas:
            self._index(r)

    def __iter__(self) -> Iterator[Replica]:
        return iter(self.replicas)

    def __len__(self) -> int:
        return len(self.replicas)

    def changed(self, replica: Replica) -> None:
        """Record that a replica's load, weight, batch size or state changed."""
        self._index(replica)
        if self.listener is not None:
            self.listener(replica)

    def guard_kv(self, on: bool) -> None:
        """Whether a KV cache booked full closes a replica's slots (``Replica.kv_guard``):
        set on every replica, the open index kept true, for the strategy about to attach."""
        for r in self.replicas:
            r.kv_guard = on
            self._index(r)

    @property
    def open_count(self) -> int:
        """Replicas that are active and have a free slot."""
        return len(self._open)

    def open_at(self, position: int) -> Replica:
        """The replica at a position of the open index, for O(1) random sampling."""
        return self.replicas[self._open[position]]

    def _index(self, r: Replica) -> None:
        pos = self._open_pos.get(r.index)
        if r.has_slot and pos is None:
            self._open_pos[r.index] = len(self._open)
            self._open.append(r.index)
        elif not r.has_slot and pos is not None:
            last = self._open.pop()
            if last != r.index:
                self._open[pos] = last
                self._open_pos[last] = pos
            del self._open_pos[r.index]
