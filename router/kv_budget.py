"""A replica's KV cache as the router books it, and the line past which it takes no more.

The batch size is not the only limit on how many requests an engine runs at once. A card
whose KV cache holds fewer contexts than its batch size (an A10 or an L4 serving an 8B model
holds about 40 of the conversation trace's, against vLLM's default of 256) admits what fits
and queues the rest inside the engine, where no other replica can take them and their first
token waits for a running request to end. So a replica whose cache is booked to ``FULL_AT``
of its size has no free slot: a request waits in the router's queue, where any replica may
take it, or goes to a replica with room. The margin below 1 is there because a booking is a
mean: requests grow as they decode, and the engine keeps a reserve before it admits a prompt.

The router books a request at its prompt plus half its ``max_tokens``, the context it holds
on average over its life if it generates them all (the performance model's saturation uses
the same mean, router/perf/model.py). Other worker processes and routers send the same
engine requests of their own: each of those (``Replica.in_flight`` counts them) is booked at
the mean of this router's own. Clients often allow far more tokens than they generate; so
the booking is scaled by what the engine itself reports. Each new reading
of its KV usage, over what the router had booked when it came, moves the scale, unless the
engine says requests wait in its own queue (booked, they hold no cache yet: such readings
would scale the booking down exactly when the cache is full, and more would be sent); between
readings the booking moves at once with every request sent and ended. Without the engine's
usage (an engine that does not publish it) the scale stays 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.request import Request

FULL_AT = 0.9
"""Share of the KV cache, booked, at which a replica takes no more requests."""
SCALE_ALPHA = 0.3
"""Weight of each new reading's ratio in the scale (an exponential average)."""
MIN_BOOKED_SHARE = 0.1
"""A reading moves the scale only when the booking is at least this share of the cache:
below it a few requests' lengths make the ratio noise, and the line is far away."""
SCALE_BOUNDS = (0.05, 4.0)
"""The scale's range: max_tokens 20 times what requests generate, or requests four times
the size of this router's on the same engine, are still followed."""


def booked_tokens(request: Request) -> float:
    """The KV tokens a request holds on average over its life: its prompt and half its output."""
    return request.prompt_tokens + request.max_tokens / 2


@dataclass(slots=True)
class KvBook:
    """What the router booked on one replica's KV cache, and the engine's scale for it."""

    booked: float = 0.0
    """Tokens booked by this router's own requests running there (``booked_tokens`` each)."""
    count: int = 0
    """Those requests."""
    mean: float = 0.0
    """Their mean booking, kept when the last one ends: what another worker's or router's
    request there is booked at (they send the same clients' requests)."""
    scale: float = 1.0
    """The engine's reported usage over the booking, averaged over readings."""
    read_at: float = -math.inf
    """When the last reading used was taken: each reading moves the scale once."""

    def add(self, request: Request) -> None:
        self.booked += booked_tokens(request)
        self.count += 1
        self.mean = self.booked / self.count

    def remove(self, request: Request) -> None:
        self.count -= 1
        if self.count:
            self.booked -= booked_tokens(request)
            self.mean = self.booked / self.count
        else:  # zero, so float drift cannot pile up over millions of requests; mean kept
            self.booked = 0.0

    def total(self, in_flight: int) -> float:
        """The booking of all ``in_flight`` requests on the replica: this router's own, and
        the others' (sibling workers', peer routers') at the mean of its own."""
        return self.booked + max(0, in_flight - self.count) * self.mean

    def tokens(self, in_flight: int) -> float:
        """The router's estimate of the tokens the cache holds now."""
        return self.total(in_flight) * self.scale

    def full(self, capacity: int | None, in_flight: int) -> bool:
        """Booked to ``FULL_AT`` of ``capacity`` or more (never when the size is unknown)."""
        return capacity is not None and self.tokens(in_flight) >= FULL_AT * capacity

    def calibrate(
        self, usage: float, capacity: int, in_flight: int, read_at: float, queued: bool
    ) -> bool:
        """Move the scale towards the engine's reading; returns whether it moved. ``queued``:
        the engine said requests wait in its own queue. Those are booked but hold no cache
        yet, so such a reading would scale the booking down just when the cache is full."""
        if read_at <= self.read_at:
            return False
        self.read_at = read_at
        total = self.total(in_flight)
        if queued or total < MIN_BOOKED_SHARE * capacity:
            return False
        low, high = SCALE_BOUNDS
        ratio = min(high, max(low, usage * capacity / total))
        self.scale += SCALE_ALPHA * (ratio - self.scale)
        return True
