"""Which replicas can take a request, read from the same rows the fleet table draws.

One answer for every pane: the header's imbalance, the GPU-models pane's ``Up`` and the
alerts all count from the rows' shown states, so no pane says a replica is up while its row
says offline. A replica is up while every GPU of it reads ``active``, ``warming`` or ``stale``
(old data is not a fault); ejected, failing, offline, lost, draining and drained replicas are not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from console.view.fleet import GpuRow
from router.snapshot import FleetSnapshot

UP_STATES = frozenset({"active", "warming", "stale"})


@dataclass(frozen=True, slots=True)
class Service:
    replicas: int
    up: frozenset[str]
    """The replicas that can take a request."""
    down: tuple[tuple[str, int], ...]
    """(shown state, replicas in it) for the others, most first."""

    @property
    def none_up(self) -> bool:
        return self.replicas > 0 and not self.up


def service(rows: Iterable[GpuRow]) -> Service:
    """Up and down replicas; a replica reads as its first GPU row that is not up."""
    states: dict[str, str] = {}
    for row in rows:
        if row.replica is not None and states.get(row.replica, "active") in UP_STATES:
            states[row.replica] = row.state
    up = frozenset(rid for rid, state in states.items() if state in UP_STATES)
    down = Counter(state for state in states.values() if state not in UP_STATES)
    return Service(len(states), up, tuple(down.most_common()))


def down_text(s: Service) -> str:
    """``6 failing, 2 ejected``."""
    return ", ".join(f"{n} {state}" for state, n in s.down)


def up_by_model(snap: FleetSnapshot, s: Service) -> dict[str, int]:
    """Replicas up per GPU model, for the GPU-models pane."""
    counts = Counter(r.gpu_model for r in snap.replicas if r.id in s.up)
    return {m.gpu_model: counts[m.gpu_model] for m in snap.by_gpu_model}
