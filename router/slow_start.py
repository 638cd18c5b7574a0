"""Slow start: a replica back in service takes its share of the load over a few seconds.

A replica that returns (undrained, readmitted after an ejection, back from a rollout's
restart) is empty, and every load-aware strategy sees an empty replica as the best place for
every new request until it holds its share. Those requests then prefill together: on the
mixed A100/V100 fleet at 0.6 of capacity, the A100 brought back in examples/scenarios/
drain-a100.yaml took 32 requests in its first second and made the drill's slowest first
tokens. While it warms up, its slot limit grows linearly from one request to its batch size
over ``router.slow_start_s`` (the idea of Envoy's and nginx's slow start, applied to slots,
which every strategy respects, rather than to weights, which only some read).
"""

from __future__ import annotations

import math


def warm_up_limit(batch_size: int, elapsed_s: float, window_s: float) -> int | None:
    """The most requests a replica back in service ``elapsed_s`` ago may run, or None once
    the window has passed (the batch size alone limits it then)."""
    if elapsed_s >= window_s:
        return None
    return max(1, math.ceil(batch_size * max(0.0, elapsed_s) / window_s))
