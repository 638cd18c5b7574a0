"""The fleet's imbalance factor: how unevenly loaded the active replicas are.

``max / min`` of load over the active replicas (not those warming up), with a floor of 0.01
so an idle replica does not divide by zero, and 1.0 when every replica is idle. Bands from
practice: under 1.1 is excellent, under 1.2 good, up to 1.5 worth watching, above 1.5 needs
action.

A replica's load is the work asked of it over a window (the work sent to it in the window
plus the work it still holds) over the work it can do in that window at its learned capacity
(the cost units it completes per second at saturation, router/capacity.py): 1.0 at its limit,
above when it is asked more than it can do. Counting the work it holds keeps a card that is
busy with a backlog from reading as idle just because nothing new was sent to it. Not
requests in flight over static-weight shares (which read "good" on a fleet whose cards were
unevenly worked, because the weights did not match the cards), and not the GPU's own
utilization, which for an LLM engine reads near 100% on any busy card
(docs/decisions/0002-imbalance-from-load.md, 0003-imbalance-over-learned-capacity.md). The
simulator, the console, the headless JSON and /metrics all compute it with
:func:`capacity_loads` and :func:`imbalance_factor`; the live router reads the work over the
last 10 seconds, the simulator over its steady-state window. The floor makes a lightly used
fleet, where every replica is below 1% of its capacity, read as balanced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

FLOOR = 0.01


class Band(StrEnum):
    EXCELLENT = "excellent"
    GOOD = "good"
    WATCH = "watch"
    ACTION = "action"


def imbalance_factor(utilizations: Iterable[float]) -> float:
    """max/min utilization (each 0..1) with the floor; 1.0 for none or all idle."""
    values = [max(u, 0.0) for u in utilizations]
    if not values or max(values) == 0.0:
        return 1.0
    return max(max(values), FLOOR) / max(min(values), FLOOR)


def counted(state: str, warm_up_limit: int | None) -> bool:
    """Whether a replica's load counts in the factor: in service, and not warming up after
    its return (router/slow_start.py), when its load is held low on purpose and, with the
    window still covering the time it was out, read near zero (the factor read 133-143 for
    two seconds after the drain drill's A100 came back)."""
    return state == "active" and warm_up_limit is None


def capacity_loads(
    sent: Sequence[float], held: Sequence[float], capacity_per_s: Sequence[float], window_s: float
) -> list[float]:
    """Each replica's work asked over ``window_s``, ``sent`` in it plus ``held`` at its end
    (cost units), over the work it can do in the window (``capacity_per_s * window_s``); 0
    where its capacity is unknown or zero."""
    return [
        (s + h) / (c * window_s) if c > 0 and window_s > 0 else 0.0
        for s, h, c in zip(sent, held, capacity_per_s, strict=True)
    ]


def band(factor: float) -> Band:
    if factor < 1.1:
        return Band.EXCELLENT
    if factor < 1.2:
        return Band.GOOD
    if factor <= 1.5:
        return Band.WATCH
    return Band.ACTION
