"""Whether the machine kept up with a live run, so that its checks measured the fleet.

A live run is three processes on whatever the machine has left: the router (judged), the
emulated fleet and the load generator. When the machine cannot carry them, requests go out
late, the emulated GPUs step late (they look slower than they are) and the router waits for
a CPU: latency and throughput checks then measure the machine. Four figures tell, as the live
strategy benchmark (bench/bench_live_strategies.py) judges its runs, in scenario seconds:

- the load generator's lateness: how far behind its schedule each request went out (p99),
  and whether any shot was not sent at all;
- the router's event loop: how much a 50 ms ticker oversleeps (p99) while its thread waits
  for a CPU (the kernel's run-queue delay, ``/proc/thread-self/schedstat``). Oversleep while
  the router itself computes is the router's own doing: it is shown, and judged by the
  checks, not excused. Where the kernel does not say, all oversleep counts as waiting;
- the emulator's clock: engine time over wall time times the time scale, for the replica
  that fell furthest behind (an engine whose steps run late loses time).

Each bound is 5% of the examples' 2 s TTFT bound, or 3% of the emulator's speed: a run within
them differs from one on an idle machine by less than the checks can tell.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ENGINE_CLOCK_MIN",
    "LATE_P99_S",
    "LOOP_STARVED_P99_S",
    "KeepingUp",
    "LoopLag",
    "keeping_up",
]

LATE_P99_S = 0.1
"""Requests sent later than this behind schedule (scenario s, p99): the generator fell behind."""
LOOP_STARVED_P99_S = 0.1
"""The router's loop late by more than this for want of a CPU (scenario s, p99): starved."""
ENGINE_CLOCK_MIN = 0.97
"""An emulated engine's time under this share of wall time x time scale: its steps ran late."""

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


@dataclass(frozen=True, slots=True)
class KeepingUp:
    """The figures of one live run, in scenario seconds, and the verdict."""

    loadgen_late_p99_s: float
    not_sent: int
    router_starved_p99_s: float
    """The router loop's lateness while its thread waited for a CPU (p99)."""
    emulator_clock_min: float | None
    """None when no replica was emulated (real endpoints keep their own time)."""
    router_lag_p99_s: float = 0.0
    """All of the router loop's lateness, its own work included (p99): shown, not excused."""
    router_lag_max_s: float = 0.0
    router_lag_max_at_s: float | None = None
    """When the worst of it began (scenario time), to set beside the checks' windows."""

    @property
    def behind(self) -> tuple[str, ...]:
        """Each way the machine fell behind, in words; empty when it kept up."""
        out = []
        if self.loadgen_late_p99_s > LATE_P99_S:
            out.append(
                f"load generator {self.loadgen_late_p99_s:.3f} s behind schedule (p99, at most "
                f"{LATE_P99_S:g})"
            )
        if self.not_sent:
            out.append(f"{self.not_sent} requests not sent")
        if self.router_starved_p99_s > LOOP_STARVED_P99_S:
            out.append(
                f"router waited {self.router_starved_p99_s:.3f} s for a CPU (p99, at most "
                f"{LOOP_STARVED_P99_S:g})"
            )
        clock = self.emulator_clock_min
        if clock is not None and clock < ENGINE_CLOCK_MIN:
            out.append(
                f"emulated GPUs ran at {clock:.3f} of their speed (at least {ENGINE_CLOCK_MIN:g})"
            )
        return tuple(out)

    @property
    def kept_up(self) -> bool:
        return not self.behind

    def describe(self) -> str:
        """One line: the verdict and its figures."""
        at = self.router_lag_max_at_s
        own = (
            f"; the router's own loop stalls: {self.router_lag_p99_s:.3f} s p99, "
            f"{self.router_lag_max_s:.3f} s at most"
            + ("" if at is None else f" (from t={at:.1f} s)")
        )
        if self.behind:
            return "machine fell behind: " + "; ".join(self.behind) + own
        clock = self.emulator_clock_min
        return (
            f"machine kept up: load generator {self.loadgen_late_p99_s:.3f} s behind schedule, "
            f"router {self.router_starved_p99_s:.3f} s waiting for a CPU (p99 each)"
            + ("" if clock is None else f", emulated GPUs at {clock:.3f} of their speed")
            + own
        )

    def to_dict(self) -> dict[str, Any]:
        clock, at = self.emulator_clock_min, self.router_lag_max_at_s
        return {
            "kept_up": self.kept_up,
            "loadgen_late_p99_s": round(self.loadgen_late_p99_s, 4),
            "not_sent": self.not_sent,
            "router_starved_p99_s": round(self.router_starved_p99_s, 4),
            "emulator_clock_min": None if clock is None else round(clock, 4),
            "router_lag_p99_s": round(self.router_lag_p99_s, 4),
            "router_lag_max_s": round(self.router_lag_max_s, 4),
            "router_lag_max_at_s": None if at is None else round(at, 3),
            "behind": list(self.behind),
            "text": self.describe(),
        }


def keeping_up(
    late_wall_s: Sequence[float],
    not_sent: int,
    loop: LoopLag,
    clock_shares: Mapping[str, float],
    time_scale: float,
    t0: float = 0.0,
) -> KeepingUp:
    """The verdict from what a run measured in wall seconds (scaled here to scenario seconds):
    each request's lateness, the router loop's ticks, and each engine's clock share. ``t0``:
    the monotonic clock's reading at scenario time 0."""
    worst = loop.worst_at
    return KeepingUp(
        loadgen_late_p99_s=_p99(late_wall_s) * time_scale,
        not_sent=not_sent,
        router_starved_p99_s=_p99(loop.starved) * time_scale,
        emulator_clock_min=min(clock_shares.values()) if clock_shares else None,
        router_lag_p99_s=_p99(loop.lags) * time_scale,
        router_lag_max_s=max(loop.lags, default=0.0) * time_scale,
        router_lag_max_at_s=None if worst is None else (worst - t0) * time_scale,
    )


def _p99(xs: Sequence[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(0.99 * len(s)) - 1))]


class LoopLag:
    """How late the event loop wakes a ticker, and how much of that its thread spent waiting
    for a CPU; wall seconds, one entry per tick."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self.lags: list[float] = []
        self.starved: list[float] = []
        self.worst_at: float | None = None
        """The monotonic clock when the tick with the most lag began."""
        self._worst = -1.0

    def tick(self, lag: float, waited: float | None, at: float | None = None) -> None:
        """One tick begun at ``at``: ``lag`` over its period, ``waited`` on the run queue
        (None: unknown, all of the lag counts as waiting)."""
        if at is not None and lag > self._worst:
            self._worst, self.worst_at = lag, at
        self.lags.append(lag)
        self.starved.append(lag if waited is None else min(lag, waited))

    async def run(self) -> None:
        """Tick until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            began, t, waited = time.monotonic(), loop.time(), run_queue_s()
            await asyncio.sleep(self.period_s)
            lag = max(0.0, loop.time() - t - self.period_s)
            now = run_queue_s()
            self.tick(lag, None if now is None or waited is None else now - waited, began)


def run_queue_s() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU; None where the kernel
    does not say."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
