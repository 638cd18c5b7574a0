"""Least outstanding tokens: the replica with the least estimated work in flight.

Least-connections counts requests; a 4,000-token request and a 20-token one count the same.
This strategy counts their estimated cost instead (``prompt_tokens * 0.5 + max_tokens`` by
default), so long requests spread out by the work they bring, not by their number.
"""

from __future__ import annotations

from router.replica import Replica
from router.strategies.least_connections import LeastConnections


class LeastOutstandingTokens(LeastConnections):
    name = "least-outstanding-tokens"
    summary = "Least estimated work (token cost) in flight; long requests weigh more."

    def key(self, r: Replica) -> float:
        return r.outstanding_cost
