"""Helpers for the learned-capacity tests (no tests here)."""

from __future__ import annotations

from collections.abc import Iterator

from router.core import RouterCore

__all__ = ["four_running"]


def four_running(core: RouterCore, index: int, life_s: float, cost: float = 1.0) -> Iterator[float]:
    """Four requests of ``cost`` on replica ``index`` at every instant, each ``life_s`` long,
    started a quarter of that apart and replaced when it ends (4 / life_s completed a
    second), in the replica's own accounting; yields the time of each event."""
    acc = core.capacity.per_replica[index]
    started: list[tuple[float, float]] = []  # (start, share mark)
    t = 0.0
    while True:
        acc.advance(len(started), t)
        if len(started) == 4:
            start, mark = started.pop(0)
            acc.completed((100, 100), cost, mark, start, t, cost)
        started.append((t, acc.share_mark()))
        yield t
        t += life_s / 4
