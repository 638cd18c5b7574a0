"""Reading ``gpurouter sim``'s rows side by side: which strategy did best, and why two did alike.

Pure functions over the rows the command prints (``result_dict`` objects, or the
``--max-sustainable`` ones); the command's table and its notes are drawn from these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FIGURES", "best", "identical_groups", "rank", "ranked_by", "why_identical"]

Row = Mapping[str, Any]

FIGURES = (
    "throughput_rps",
    "capacity_fraction",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "imbalance_factor",
    "lost_requests",
    "completed",
)
"""What a plain run's row measured: two rows equal in all of them ran alike."""

_SUSTAINABLE_FIGURES = ("max_sustainable_rps", "at_max")

_REDUCES_TO = {
    # strategy: (the strategy it places requests as, for which requests)
    "affinity": (
        "weighted-least-connections",
        "every request without an affinity key (the simulator sends none)",
    ),
    "tiered": (
        "weighted-least-connections",
        "every request that is not heavy, or finds no replica of its strong tier",
    ),
    "capacity-aware": (
        "least-outstanding-tokens",
        "every request while each replica's KV cache has room for it and no engine queue",
    ),
}
"""Where one strategy is another for some requests: the known reasons two rows agree."""


def ranked_by(sustainable: bool) -> str:
    """The field the rows are ranked by: the highest sustainable rate (then the p99 TTFT at
    it), else the p99 TTFT (the figure the SLO and the search judge; then the most served)."""
    return "max_sustainable_rps" if sustainable else "ttft_p99_s"


def _key(row: Row, sustainable: bool) -> tuple[float, ...]:
    if sustainable:
        at_max = row["at_max"] or {}
        return (-float(row["max_sustainable_rps"]), _latency(at_max.get("ttft_p99_s")))
    # At equal latency, more served is better.
    return (_latency(row["ttft_p99_s"]), -float(row["throughput_rps"]))


def _latency(seconds: float | None) -> float:
    return float("inf") if seconds is None else float(seconds)  # null: unbounded, the worst


def rank(rows: Sequence[Row], sustainable: bool) -> list[Row]:
    """Best first (ties in name order)."""
    return sorted(rows, key=lambda r: (*_key(r, sustainable), str(r["strategy"])))


def best(rows: Sequence[Row], sustainable: bool) -> set[str]:
    """The strategies that share the best figure (several when they tie)."""
    if not rows:
        return set()
    top = min(_key(r, sustainable) for r in rows)
    return {str(r["strategy"]) for r in rows if _key(r, sustainable) == top}


def identical_groups(rows: Sequence[Row], sustainable: bool) -> list[list[str]]:
    """Strategies whose rows agree in every figure, in groups of two or more."""
    fields = _SUSTAINABLE_FIGURES if sustainable else FIGURES
    groups: dict[tuple[str, ...], list[str]] = {}
    for row in rows:
        groups.setdefault(tuple(repr(row.get(f)) for f in fields), []).append(str(row["strategy"]))
    return [sorted(names) for names in groups.values() if len(names) > 1]


def why_identical(names: Sequence[str]) -> str:
    """Why these strategies' runs came out the same, as far as it is known."""
    reasons = [
        f"{name} places {which} as {other} does"
        for name, (other, which) in _REDUCES_TO.items()
        if name in names and other in names
    ]
    return "; ".join(reasons) if reasons else "they placed these arrivals alike"
