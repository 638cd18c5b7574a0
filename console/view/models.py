"""Per-GPU-model summary: is each tier carrying the share its learned capacity says it should?

``Thr/Cap`` is the tier's share of the fleet's throughput over its share of the fleet's learned
capacity (router/capacity.py: measured where the router has seen enough completions, else the
performance model's prior or the static weight)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from console.view.format import NONE, Cell, Tone, number, pct
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


def verdict(m: GpuModelSummary, up: int) -> Cell:
    """Words first: ``▼ under`` is a tier doing less than its share of learned capacity,
    ``▲ over`` more."""
    if up == 0:
        return ("✖ none up", Tone.BAD)
    if m.throughput_rps <= 0 or m.capacity_share <= 0:
        return ("· idle", Tone.DIM)
    ratio = m.throughput_share / m.capacity_share
    if ratio < UNDER:
        return ("▼ under", Tone.WARN)
    if ratio > OVER:
        return ("▲ over", Tone.WARN)
    return ("= even", Tone.OK)


def model_rows(
    summaries: Iterable[GpuModelSummary], up: Mapping[str, int] | None = None
) -> list[tuple[Cell, ...]]:
    """One row per GPU model; ``up``: replicas up per model as the fleet table's rows read
    (console/view/service.py), else those the router has in service."""
    out: list[tuple[Cell, ...]] = []
    for m in summaries:
        n = m.active if up is None else up.get(m.gpu_model, 0)
        out.append(
            (
                (m.gpu_model, Tone.ACCENT),
                (f"{n}/{m.replicas}", Tone.NORMAL if n == m.replicas else Tone.WARN),
                (pct(m.utilization), Tone.NORMAL),
                (f"{pct(m.throughput_share)}/{pct(m.capacity_share)}", Tone.NORMAL),
                (number(m.imbalance_factor) if n else NONE, Tone.NORMAL if n else Tone.DIM),
                verdict(m, n),
            )
        )
    return out
