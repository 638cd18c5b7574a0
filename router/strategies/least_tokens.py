"""Least outstanding tokens: the replica with the least estimated work in flight.

Least-connections counts requests; a 4,000-token request and a 20-token one count the same.
This strategy counts their estimated cost instead (``prompt_tokens * 0.5 + max_tokens`` by
default), so long requests spread out by the work they bring, not by their number; and it
divides that work by the replica's learned capacity (``Replica.speed``), so the score is the
seconds of work a replica holds.
"""

from __future__ import annotations

from router.replica import Replica
from router.strategies.least_connections import LeastConnections


class LeastOutstandingTokens(LeastConnections):
    name = "least-outstanding-tokens"
    summary = "Least estimated work (token cost) in flight over learned capacity."

    def key(self, r: Replica) -> float:
        return r.outstanding_cost / r.speed
