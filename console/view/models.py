"""Per-GPU-model summary: is each tier carrying the share its learned capacity says it should?

``Thr/Cap`` is the tier's share of the fleet's throughput over its share of the fleet's learned
capacity (router/capacity.py: measured where the router has seen enough completions, else the
performance model's prior or the static weight)."""

from __future__ import annotations

from collections.abc import Iterable

from console.view.format import Cell, Tone, number, pct
from router.snapshot import GpuModelSummary

UNDER = 0.8
OVER = 1.25
"""Throughput share over learned-capacity share outside these bounds flags a tier that is
given less (or more) than it can do."""

HEADINGS = ("GPU model", "Up", "Util", "Thr/Cap", "Imb", "Verdict")
LEGEND = "Cap: share of learned capacity"
"""Under the summary: what ``Cap`` means, now that it is learned rather than the weights'."""
HELP = (
    "Per GPU model: replicas up, mean utilization, share of the fleet's throughput / share of"
    " its learned capacity (req/s each card can do), imbalance, verdict."
)


def verdict(m: GpuModelSummary) -> Cell:
    """Words first: ``▼ under`` is a tier doing less than its share of learned capacity,
    ``▲ over`` more."""
    if m.active == 0:
        return ("✖ none up", Tone.BAD)
    if m.throughput_rps <= 0 or m.capacity_share <= 0:
        return ("· idle", Tone.DIM)
    ratio = m.throughput_share / m.capacity_share
    if ratio < UNDER:
        return ("▼ under", Tone.WARN)
    if ratio > OVER:
        return ("▲ over", Tone.WARN)
    return ("= even", Tone.OK)


def model_rows(summaries: Iterable[GpuModelSummary]) -> list[tuple[Cell, ...]]:
    out: list[tuple[Cell, ...]] = []
    for m in summaries:
        out.append(
            (
                (m.gpu_model, Tone.ACCENT),
                (f"{m.active}/{m.replicas}", Tone.NORMAL if m.active == m.replicas else Tone.WARN),
                (pct(m.utilization), Tone.NORMAL),
                (f"{pct(m.throughput_share)}/{pct(m.capacity_share)}", Tone.NORMAL),
                (number(m.imbalance_factor), Tone.NORMAL),
                verdict(m),
            )
        )
    return out
