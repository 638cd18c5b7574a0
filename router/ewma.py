"""Peak-sensitive, time-decayed moving average (the "peak EWMA" of Finagle and Linkerd).

A new sample above the current value is taken at once (so a replica that turns slow is
avoided at once); lower samples pull the value down with a time constant ``tau``, so recovery
is gradual and independent of the request rate.
"""

from __future__ import annotations

import math


class PeakEwma:
    __slots__ = ("_stamp", "tau", "value")

    def __init__(self, tau: float = 10.0, initial: float | None = None) -> None:
        self.tau = tau
        self.value = initial
        self._stamp: float | None = None

    def observe(self, sample: float, now: float) -> None:
        if self.value is None or self._stamp is None or sample > self.value:
            self.value = sample
        else:
            w = math.exp(-max(now - self._stamp, 0.0) / self.tau)
            self.value = self.value * w + sample * (1.0 - w)
        self._stamp = now

    def age(self, now: float) -> float | None:
        """Seconds since the last sample, or None before the first."""
        return None if self._stamp is None else now - self._stamp


class Ewma:
    """Plain time-decayed moving average: every sample pulls with time constant ``tau``."""

    __slots__ = ("_stamp", "tau", "value")

    def __init__(self, tau: float = 60.0, initial: float | None = None) -> None:
        self.tau = tau
        self.value = initial
        self._stamp: float | None = None

    def observe(self, sample: float, now: float) -> None:
        if self.value is None or self._stamp is None:
            self.value = sample
        else:
            w = math.exp(-max(now - self._stamp, 0.0) / self.tau)
            self.value = self.value * w + sample * (1.0 - w)
        self._stamp = now
