"""Text for numbers: bars, sparklines, rates and durations, sized for table cells."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARKS = "▁▂▃▄▅▆▇█"
NONE = "—"
"""Shown where there is no value (no telemetry, no sample yet)."""


class Tone(StrEnum):
    """What a value means, for colour; the words and symbols carry the meaning on their own."""

    NORMAL = "normal"
    DIM = "dim"
    OK = "ok"
    WARN = "warn"
    BAD = "bad"
    ACCENT = "accent"


Cell = tuple[str, Tone]
"""A cell's text and tone; equal cells are not redrawn."""


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of ``width`` cells filled to ``fraction`` (0..1), in eighths."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part and full < width else "")
    return text.ljust(width, "░" if width else " ")[:width]


def sparkline(values: Iterable[float], width: int) -> str:
    """The last ``width`` values (each 0..1) as block characters, right-aligned."""
    points = list(values)[-width:]
    chars = "".join(_SPARKS[min(len(_SPARKS) - 1, max(0, int(v * len(_SPARKS))))] for v in points)
    return chars.rjust(width)


def pct(fraction: float) -> str:
    """``0.623`` -> ``62%``."""
    return f"{round(fraction * 100):d}%"


def rate(per_s: float) -> str:
    """Requests or tokens per second, short: ``0.4``, ``12.3``, ``1.2k``."""
    if per_s >= 10_000:
        return f"{per_s / 1000:.0f}k"
    if per_s >= 1000:
        return f"{per_s / 1000:.1f}k"
    if per_s >= 100:
        return f"{per_s:.0f}"
    return f"{per_s:.1f}"


def duration(seconds: float | None) -> str:
    """A latency or an age, short: ``<1ms``, ``42ms``, ``1.3s``, ``2m05s``; ``—`` for None."""
    if seconds is None:
        return NONE
    if seconds < 0.001:
        # Microseconds are noise on a screen refreshed each second (a decision "0us ago").
        return "<1ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def tokens(count: int) -> str:
    """A token count, short: ``900``, ``9.5k``, ``450k``, ``1.2M``."""
    if count < 1000:
        return str(count)
    if count < 9_950:
        return f"{count / 1000:.1f}k"
    if count < 999_500:
        return f"{count / 1000:.0f}k"
    if count < 9_950_000:
        return f"{count / 1e6:.1f}M"
    return f"{count / 1e6:.0f}M"


def number(value: float) -> str:
    """A weight or factor: ``2.2``, ``1``, ``0.25``."""
    return f"{value:.3g}"


def fit(text: str, width: int) -> str:
    """Cut ``text`` to ``width`` cells, marking the cut with an ellipsis."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
