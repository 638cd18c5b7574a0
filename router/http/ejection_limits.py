"""How far outlier ejection may go: the maximum ejected share and panic mode.

Health checking judges replicas one at a time, and each judgement can be wrong or stale: a
replica killed and restarted is ejected for a window it no longer deserves, a broken health
endpoint fails every probe. Judged one by one, the whole fleet can end up ejected while its
replicas answer. Two limits, as Envoy's outlier detection has them (``max_ejection_percent``
and the healthy panic threshold), bound what the judgements can do together:

- **Maximum ejected share**: the monitor keeps at most ``max_ejection_percent`` of the
  replicas in service out at once, rounded down (with 50%: one of 2 or 3, none of 1), so below
  100% at least one replica always stays in rotation. A replica judged unhealthy beyond the
  limit stays in service, still counted unhealthy.
- **Panic mode**: when fewer than ``panic_threshold_percent`` of the replicas in service are
  healthy, the judgements are no longer trusted: every replica in service is routed to, the
  ejected ones readmitted, until enough are healthy again.

"In service" is what the operator left in rotation: active replicas and those the monitor
ejected, not the ones an operator drained or ejected. Plain arithmetic, no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FleetHealth"]


@dataclass(frozen=True, slots=True)
class FleetHealth:
    """How many replicas are in service and how many of them the monitor judges healthy."""

    in_service: int
    healthy: int

    def max_ejected(self, max_ejection_percent: float) -> int:
        """How many of the replicas in service may be ejected at once (rounded down)."""
        # Integer arithmetic on hundredths: 3 * 33.34 / 100 must not round up by float error.
        return self.in_service * round(max_ejection_percent * 100) // 10_000

    def panic(self, panic_threshold_percent: float) -> bool:
        """Fewer than the threshold's share are healthy (never with nothing in service)."""
        return self.healthy * 100 < panic_threshold_percent * self.in_service

    def describe(self, panic_threshold_percent: float) -> str:
        """``3 of 8 replicas in service healthy (panic below 50%)``."""
        return (
            f"{self.healthy} of {self.in_service} replicas in service healthy "
            f"(panic below {panic_threshold_percent:g}%)"
        )
