"""Clocks are injected so that the core runs on real time, virtual time or test time alike."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; only differences are meaningful."""

    def __call__(self) -> float: ...


def monotonic() -> float:
    """The real clock."""
    return time.monotonic()


class ManualClock:
    """A clock that moves only when told: for tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.now += seconds
