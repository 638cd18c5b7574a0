"""The requests running on a replica now, as a confirmation shows them.

One listing for the console in the router's process and for the admin API
(``GET /admin/state?running=1``), so an attached console confirms with the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from router.request import Priority

if TYPE_CHECKING:
    from router.core import RouterCore
    from router.replica import Replica

__all__ = ["InFlight", "in_flight"]


@dataclass(frozen=True, slots=True)
class InFlight:
    """One request running on a replica."""

    request_id: str
    priority: str
    streaming: bool
    """Its first byte has reached the client: it cannot be re-run elsewhere."""


def in_flight(core: RouterCore, replica: Replica) -> list[InFlight]:
    """What runs on ``replica`` now, in the order it was sent there."""
    running = core.running
    out = []
    for rid, req in replica.running.items():
        attempt = running.get(rid)
        streaming = attempt is not None and attempt.first_byte is not None
        out.append(InFlight(rid, Priority(req.priority).name.lower(), streaming))
    return out
