"""A replica's learned capacity in words: how much it can do, and where each figure came from.

The router learns each replica's service rate and KV-cache size (router/capacity.py); every
figure carries its source and, where it has one, its age. ``learned``, ``kv`` and ``booked``
are the short forms ``gpurouter ctl status`` prints; ``capacity_lines`` is the replica detail
screen's block.
"""

from __future__ import annotations

from console.view.format import NONE, Cell, Tone, duration, pct, rate, tokens
from router.snapshot import ReplicaSnapshot

__all__ = ["at_once_count", "booked", "capacity_lines", "kv", "learned"]


def learned(rps: float, source: str, age_s: float | None, at_once: float | None = None) -> str:
    """``12.4 r/s measured 3.0s``: requests per second, where from, and since the last
    completion refined it (nothing for a figure no completion has refined); ``(2 at once)``
    after a measured figure that speaks only for that many requests at once, short of the
    batch size (router/capacity.py, ``measured_concurrency``), not for the card full."""
    text = f"{rate(rps)} r/s {source}"
    if age_s is not None:
        text = f"{text} {duration(age_s)}"
    if at_once is not None and source == "measured":
        text = f"{text} ({at_once_count(at_once)} at once)"
    return text


def at_once_count(at_once: float) -> str:
    """Requests at once, as a whole number (at least 1)."""
    return str(max(1, round(at_once)))


def kv(count: int | None, source: str | None, age_s: float | None) -> str:
    """``450k tok engine 2.0s``: the KV cache's size in tokens, where from, and the age of the
    engine reading behind it (the fleet file's and the prior's have none); ``—`` unknown."""
    if count is None:
        return NONE
    text = f"{tokens(count)} tok {source or ''}".rstrip()
    return text if age_s is None else f"{text} {duration(age_s)}"


def booked(booked_tokens: float | None, capacity: int | None, full: bool) -> str:
    """``62% booked``, ``91% booked, full``: the router's booking of the KV cache
    (router/kv_budget.py) over its size; ``""`` when the size is not known for certain."""
    if booked_tokens is None or not capacity:
        return ""
    text = f"{pct(booked_tokens / capacity)} booked"
    return f"{text}, full" if full else text


def _booking(r: ReplicaSnapshot) -> list[Cell]:
    text = booked(r.kv_booked_tokens, r.kv_capacity_tokens, r.kv_full)
    if not text:
        return []
    cells: list[Cell] = [("   ", Tone.DIM), (text, Tone.WARN if r.kv_full else Tone.NORMAL)]
    if r.kv_booking_scale != 1.0:  # the engine's usage has rescaled the booking
        cells.append((f" (x{r.kv_booking_scale:.2f})", Tone.DIM))
    return cells


def capacity_lines(r: ReplicaSnapshot) -> tuple[tuple[Cell, ...], ...]:
    """Learned rate with its source, age and the load on it; the prior against the
    measurement; the KV cache with its source and age, and the engine's preemptions."""
    refined: Cell = (
        ("  never refined by a completion", Tone.DIM)
        if r.capacity_age_s is None
        else (f"  refined {duration(r.capacity_age_s)} ago", Tone.DIM)
    )
    measured: Cell = (
        (f"{rate(r.capacity_measured_rps)} req/s", Tone.NORMAL)
        if r.capacity_measured_rps is not None
        else (f"{NONE} (nothing completed yet)", Tone.DIM)
    )
    at_once: list[Cell] = (
        []
        if r.capacity_measured_concurrency is None
        else [
            (
                f", for {at_once_count(r.capacity_measured_concurrency)} at once of its "
                f"{r.batch_size}",
                Tone.DIM,
            )
        ]
    )
    kv_size: Cell = (
        ("unknown", Tone.DIM)
        if r.kv_capacity_tokens is None
        else (f"{tokens(r.kv_capacity_tokens)} tokens", Tone.NORMAL)
    )
    kv_from: list[Cell] = []
    if r.kv_capacity_source is not None:
        kv_from.append(("  from ", Tone.DIM))
        kv_from.append((r.kv_capacity_source, Tone.NORMAL))
    if r.kv_capacity_age_s is not None:
        kv_from.append((f", read {duration(r.kv_capacity_age_s)} ago", Tone.DIM))
    preemptions: Cell = (
        (NONE, Tone.DIM)
        if r.engine_preemptions is None
        else (str(r.engine_preemptions), Tone.NORMAL)
    )
    override: list[Cell] = (
        [("   (a pinned weight overrides both)", Tone.DIM)]
        if r.capacity_source == "operator"
        else []
    )
    return (
        (
            ("learned ", Tone.DIM),
            (f"{rate(r.capacity_rps)} req/s", Tone.ACCENT),
            ("  from ", Tone.DIM),
            (r.capacity_source, Tone.NORMAL),
            refined,
            ("   load ", Tone.DIM),
            (f"{pct(r.load)} of it", Tone.WARN if r.load >= 1.0 else Tone.NORMAL),
        ),
        (
            ("prior ", Tone.DIM),
            (f"{rate(r.capacity_prior_rps)} req/s", Tone.NORMAL),
            ("   measured ", Tone.DIM),
            measured,
            *at_once,
            *override,
        ),
        (
            ("KV cache ", Tone.DIM),
            kv_size,
            *kv_from,
            *_booking(r),
            ("   engine preemptions ", Tone.DIM),
            preemptions,
        ),
    )
