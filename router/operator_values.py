"""The range of each value an operator sets on a replica: its weight and its batch size.

One definition for every path a value comes in by: the fleet file (router/config/loader.py),
the control surface and the commands it reads (the console, the admin API, the MQTT control
topic, scenarios: router/control.py) and ``gpurouter ctl`` before it sends. A value outside
its range is refused with a message that states the range, never clamped: an operator who
typed 1e308 meant something else. Why bounds at all: two replicas weighted 1e308 made the
sum of weights infinite, and weighted-random then sent every request to the third replica,
weighted 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "batch_size_problem",
    "non_finite",
    "weight_problem",
]

MIN_WEIGHT = 1e-6
MAX_WEIGHT = 1e6
"""Weights are relative: a ratio of 1e12 between two replicas is already "none at all", and
sums of a fleet's weights stay finite and exact enough."""
MAX_BATCH_SIZE = 65536
"""Far above what any engine runs at once (vLLM's ``max_num_seqs`` is 256 by default)."""


def weight_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a weight, or None (NaN and infinities are outside)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not MIN_WEIGHT <= value <= MAX_WEIGHT
    ):
        return f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, not {_shown(value)}"
    return None


def batch_size_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a batch size, or None."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_BATCH_SIZE:
        return None
    return f"batch size must be a whole number from 1 to {MAX_BATCH_SIZE}, not {_shown(value)}"


def non_finite(value: object) -> bool:
    """Whether ``value`` holds NaN or an infinity anywhere (in its lists and mappings too)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Mapping | list | tuple):
        items = value.values() if isinstance(value, Mapping) else value
        return any(non_finite(item) for item in items)
    return False


def _shown(value: object) -> str:
    """``value`` as the message shows it: a 400-digit number is cut short."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
