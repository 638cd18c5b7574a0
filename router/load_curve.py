"""How an engine the performance model does not know slows down as it runs more at once.

Learned capacity reads a replica's accounting through the model's efficiency curve: how much
of its saturation rate an engine delivers at each concurrency. For a card or model missing
from the profiles (a GPU the catalog lacks, the real-engine lab's CPU cores) there is no curve,
and work done over time measures only the throughput at the concurrency the router happened
to run, which is the load it was sent, not what it can do: two engines 4x apart in speed,
each run well below saturation, read 5.6x apart one minute and 3x the next.

An LLM engine's step takes about ``a + b * c`` with ``c`` sequences in the batch (a fixed
cost, the weights read once, plus a cost per sequence), and each sequence advances one step
at a time; so the seconds a request spends per unit of its work grow linearly with the
concurrency it ran at, and the engine completes ``X(c) = c / (a + b * c)`` units a second.
Each completed request gives one point: the (harmonic) mean concurrency over its life and
its seconds per unit of work. A weighted least-squares line through the recent points
(decayed with the measurement's time constant) gives ``a`` and ``b``, and ``X`` at the
replica's batch size is its rate at saturation. Arrivals vary the concurrency enough to
separate ``a`` from ``b`` within a few dozen requests; until they do, or where the line makes
no physical sense, there is no figure and the plain measurement stands.

How far the line is read depends on how well the points pin it down. ``X`` is read at the
batch size when the line's own standard error there is within ``TOLERANCE`` of what it says:
an engine sent a few requests at once by light load still gets its rate at 64 when its points
lie on a clear line. Where they scatter, it is read at no more than ``REACH`` times the highest
concurrency the points cover, so that a card only ever run at 2 at once, noisily, is not
credited with what the line says of 64.
"""

from __future__ import annotations

import math

__all__ = ["MIN_POINTS", "REACH", "TOLERANCE", "LoadCurve"]

MIN_POINTS = 20.0
"""Completions (decayed) before the line is trusted."""
MIN_SPREAD = 0.1
"""Least spread of the points' concurrency, as a fraction of its mean, to fit a slope."""
REACH = 4.0
"""How far past the highest concurrency seen a scattered line is still read."""
TOLERANCE = 0.05
"""Relative standard error of the line's seconds per unit at a concurrency, up to which the
line is read there however far past its points: at 5%, two standard errors are the 10% that
learned capacity is asked to be within."""


class LoadCurve:
    """Decayed weighted sums for the line ``seconds per unit of work = a + b * concurrency``."""

    __slots__ = ("_c", "_cc", "_cu", "_high", "_n", "_u", "_uu", "_w", "_ww")

    def __init__(self) -> None:
        self._n = self._w = self._c = self._cc = self._u = self._cu = 0.0
        self._uu = self._ww = 0.0
        self._high = 0.0
        """Highest concurrency among the points, decayed towards the recent ones."""

    def add(self, concurrency: float, seconds_per_unit: float, weight: float, decay: float) -> None:
        """One completed request; ``decay`` scales down what came before (time passed)."""
        if not (concurrency > 0 and seconds_per_unit > 0 and weight > 0):
            return
        self._n = self._n * decay + 1.0
        self._w = self._w * decay + weight
        self._ww = self._ww * decay * decay + weight * weight
        self._c = self._c * decay + weight * concurrency
        self._cc = self._cc * decay + weight * concurrency * concurrency
        self._u = self._u * decay + weight * seconds_per_unit
        self._cu = self._cu * decay + weight * concurrency * seconds_per_unit
        self._uu = self._uu * decay + weight * seconds_per_unit * seconds_per_unit
        self._high = max(self._high * decay, concurrency)

    def line(self) -> tuple[float, float] | None:
        """``(a, b)``, or None while the points cannot say."""
        if self._n < MIN_POINTS or self._w <= 0:
            return None
        mean_c = self._c / self._w
        var_c = self._cc / self._w - mean_c * mean_c
        if var_c <= (MIN_SPREAD * mean_c) ** 2:
            return None
        mean_u = self._u / self._w
        b = (self._cu / self._w - mean_c * mean_u) / var_c
        if b <= 0:
            return None  # slower with fewer at once: noise, not an engine
        return max(mean_u - b * mean_c, 0.0), b

    @property
    def highest(self) -> float:
        """Highest concurrency among the points, decayed towards the recent ones (0: none)."""
        return self._high

    def rate_at(self, concurrency: float) -> float | None:
        """Units of work a second at ``concurrency``; at ``REACH`` x the highest seen when the
        line is not known there to within ``TOLERANCE``."""
        reading = self.reading(concurrency)
        return None if reading is None else reading[1]

    def reading(self, concurrency: float) -> tuple[float, float] | None:
        """Where ``rate_at`` reads the line for ``concurrency`` (there, or short of it), and
        the rate there; None while the line cannot be drawn."""
        fitted = self.line()
        if fitted is None:
            return None
        a, b = fitted
        c = concurrency
        if self._relative_error(a, b, c) > TOLERANCE:
            c = min(concurrency, REACH * self._high)
        return c, c / (a + b * c)

    def _relative_error(self, a: float, b: float, concurrency: float) -> float:
        """Standard error of the line's value at ``concurrency`` over that value (weighted
        least squares: the residuals' variance, the points' effective number, their spread)."""
        w = self._w
        mean_c = self._c / w
        var_c = self._cc / w - mean_c * mean_c
        mean_u = self._u / w
        residual = max(self._uu / w - mean_u * mean_u - b * b * var_c, 0.0)
        n_eff = w * w / self._ww
        offset = concurrency - mean_c
        variance = residual / n_eff * (1.0 + offset * offset / var_c)
        value = a + b * concurrency
        return math.sqrt(variance) / value if value > 0 else math.inf
