"""One replica in detail: its facts and why recent requests were routed to it."""

from __future__ import annotations

from collections.abc import Sequence

from console.view.fleet import state_cell
from console.view.format import Cell, Tone, duration, number, rate
from router.snapshot import ReplicaSnapshot
from router.strategies import Explanation

SHOWN_CANDIDATES = 3


def facts(r: ReplicaSnapshot) -> tuple[tuple[Cell, ...], ...]:
    """The replica's facts, a line each; why it is in its state (an ejection's reason, who
    drained it), a model mismatch and a card mismatch add a line each."""
    pin_w = " (pinned)" if r.weight_pinned else ""
    pin_b = " (pinned)" if r.batch_pinned else ""
    util_src = "GPU" if r.utilization_from_telemetry else "router estimate"
    lines: tuple[tuple[Cell, ...], ...] = (
        (
            (r.id, Tone.ACCENT),
            (f"  on {r.node}, {r.gpu_model} x{len(r.gpus)}, tier {r.tier}  ", Tone.DIM),
            state_cell("stale" if r.stale and r.state == "active" else r.state),
        ),
        (
            ("weight ", Tone.DIM),
            (f"{number(r.static_weight)} static, {number(r.weight)} effective{pin_w}", Tone.NORMAL),
            ("   batch ", Tone.DIM),
            (f"{r.in_flight}/{r.batch_size}{pin_b}{_warming(r)}", Tone.NORMAL),
            ("   util ", Tone.DIM),
            (f"{r.utilization:.0%} ({util_src})", Tone.NORMAL),
        ),
        (
            ("throughput ", Tone.DIM),
            (f"{rate(r.throughput_rps)} req/s, {rate(r.output_tokens_per_s)} tok/s", Tone.NORMAL),
            ("   TTFT ", Tone.DIM),
            (f"p50 {duration(r.ttft_p50_s)} p99 {duration(r.ttft_p99_s)}", Tone.NORMAL),
            ("   e2e ", Tone.DIM),
            (f"p50 {duration(r.e2e_p50_s)} p99 {duration(r.e2e_p99_s)}", Tone.NORMAL),
        ),
        (
            ("completed ", Tone.DIM),
            (str(r.completed), Tone.NORMAL),
            ("   failed ", Tone.DIM),
            (str(r.failed), Tone.BAD if r.failed else Tone.NORMAL),
            ("   retries ", Tone.DIM),
            (str(r.retries), Tone.NORMAL),
            ("   telemetry age ", Tone.DIM),
            (duration(r.telemetry_age_s), Tone.WARN if r.stale else Tone.NORMAL),
        ),
    )
    if r.state_reason:
        tone = Tone.BAD if r.state == "ejected" else Tone.NORMAL
        why: tuple[Cell, ...] = (("why ", Tone.DIM), (f"{r.state}: {r.state_reason}", tone))
        lines = (lines[0], why, *lines[1:])
    if r.model_mismatch is not None:
        model: tuple[Cell, ...] = (
            ("model ", Tone.DIM),
            (f"⚠ {r.model_mismatch}: none of {r.model}'s requests go here", Tone.BAD),
        )
        lines = (*lines, model)
    if r.gpu_mismatch is not None:
        modelled = r.capacity_prior_gpu
        on = "" if modelled is None else f": its prior is modelled on {modelled}"
        card: tuple[Cell, ...] = (("card ", Tone.DIM), (f"⚠ {r.gpu_mismatch}{on}", Tone.WARN))
        lines = (*lines, card)
    return lines


def _warming(r: ReplicaSnapshot) -> str:
    return "" if r.warm_up_limit is None else f" (warming up: {r.warm_up_limit} for now)"


def _score(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def decision_lines(
    decisions: Sequence[Explanation] | None, replica: str, now: float
) -> list[tuple[Cell, ...]]:
    """Newest first: when, which request, the chosen score against the best others'; None:
    not fetched yet (an attached console asks its router at its next poll)."""
    if decisions is None:
        return [(("Fetching the recent decisions from the router…", Tone.DIM),)]
    if not decisions:
        return [(("No recent decision chose this replica.", Tone.DIM),)]
    lines: list[tuple[Cell, ...]] = []
    for d in decisions:
        chosen = next((c for c in d.candidates if c.replica == replica), None)
        others = sorted(
            (c for c in d.candidates if c.replica != replica and c.eligible),
            key=lambda c: (c.score is None, c.score or 0.0, c.replica),
        )[:SHOWN_CANDIDATES]
        head: list[Cell] = [
            (f"{duration(max(0.0, now - d.time))} ago ", Tone.DIM),
            (d.request_id, Tone.ACCENT),
            (f"  {d.strategy}", Tone.NORMAL),
            (f"  score {_score(chosen.score if chosen else None)}", Tone.NORMAL),
        ]
        if chosen is not None:
            head.append((f" in-flight {chosen.in_flight} weight {number(chosen.weight)}", Tone.DIM))
        if d.note:
            head.append((f"  ({d.note})", Tone.DIM))
        lines.append(tuple(head))
        if others:
            alts = ", ".join(f"{c.replica} {_score(c.score)}" for c in others)
            lines.append((("    vs ", Tone.DIM), (alts, Tone.NORMAL)))
        elif d.candidates:
            lines.append((("    no other replica could take it", Tone.DIM),))
    return lines
