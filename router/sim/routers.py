"""Several routers in front of one simulated fleet: the L4 balancer and the broker hop.

Live, routers on different machines sit behind any L4 balancer, each with its own core, and
learn each other's load only from the ``routers/<id>/stats`` messages the broker relays. The
simulator models exactly that: :class:`Routers` says how many cores, how the balancer spreads
arrivals over them (round-robin, or a seeded random draw), how often each publishes its own
load per replica (``stats_interval_s``: the live stats period) and how long the broker takes
to hand a message to the others (a uniform draw between ``broker_delay_s``'s bounds, per
message); ``sharing=False`` is the same fleet with no load shared at all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from router.peer_load import STATS_PERIOD_S

BALANCERS = ("round-robin", "random")
BROKER_DELAY_S = (0.005, 0.05)
"""A broker hop: publish to delivery, one LAN round trip to a few tens of ms under load."""


@dataclass(frozen=True, slots=True)
class Routers:
    """The routers in front of the simulated fleet (one, by default: a plain run)."""

    count: int = 1
    sharing: bool = True
    """Each router counts its peers' published load (router/peer_load.py)."""
    stats_interval_s: float = STATS_PERIOD_S
    broker_delay_s: tuple[float, float] = BROKER_DELAY_S
    balancer: str = "round-robin"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"routers must be at least 1, got {self.count}")
        if not self.stats_interval_s > 0:
            raise ValueError(f"stats_interval_s must be > 0, got {self.stats_interval_s}")
        lo, hi = self.broker_delay_s
        if not 0 <= lo <= hi:
            raise ValueError(f"broker_delay_s must be 0 <= low <= high, got {lo}, {hi}")
        if self.balancer not in BALANCERS:
            raise ValueError(f"balancer must be one of {', '.join(BALANCERS)}, not {self.balancer}")

    @property
    def exchanging(self) -> bool:
        """Whether load reports travel at all."""
        return self.sharing and self.count > 1

    def peer_stale_after_s(self) -> float:
        """How long a silent peer still counts: three stats periods, as node telemetry."""
        return 3 * self.stats_interval_s


class Balancer:
    """Which router takes the next arrival, as an L4 balancer spreads connections."""

    def __init__(self, routers: Routers, rng: random.Random) -> None:
        self.routers = routers
        self.rng = rng
        self._next = 0

    def pick(self) -> int:
        n = self.routers.count
        if self.routers.balancer == "random":
            return self.rng.randrange(n)
        k, self._next = self._next, (self._next + 1) % n
        return k

    def delay(self) -> float:
        """One broker hop for one message."""
        lo, hi = self.routers.broker_delay_s
        return self.rng.uniform(lo, hi)
