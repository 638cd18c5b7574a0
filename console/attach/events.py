"""The attached router's audit trail, followed across dropped connections.

:func:`follow_events` reads ``GET /admin/events?follow=1`` and, when the stream ends or the
connection drops, opens it again after a backoff with ``since`` set to the last event it
delivered: nothing is missed, nothing is delivered twice. The stream and the sleep are
passed in, so the resumption is tested without sockets or clocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from console.attach.link import Backoff
from console.attach.rebuild import rebuild
from router.control import Event
from router.errors import GpuRouterError

__all__ = ["EventCursor", "follow_events"]

OpenStream = Callable[[int], AsyncIterator[dict[str, Any]]]
"""Opens the trail after a sequence number: ``AsyncAdmin.follow``."""


@dataclass(slots=True)
class EventCursor:
    """The newest event delivered; later ones only, each once."""

    since: int = 0

    def accept(self, event: Event) -> bool:
        if event.seq <= self.since:
            return False
        self.since = event.seq
        return True


async def follow_events(
    open_stream: OpenStream,
    cursor: EventCursor,
    deliver: Callable[[Event], None],
    *,
    sleep: Callable[[float], Awaitable[None]],
    backoff: Backoff | None = None,
    lost: Callable[[str], None] | None = None,
) -> None:
    """Deliver every event after ``cursor.since``, for ever (until cancelled)."""
    backoff = backoff or Backoff()
    failures = 0
    while True:
        try:
            async for data in open_stream(cursor.since):
                failures = 0  # it answered: a later drop starts the backoff again
                event = rebuild(Event, data)
                if cursor.accept(event):
                    deliver(event)
            reason = "the router closed the event stream"
        except (GpuRouterError, ValueError) as exc:
            reason = str(exc)
        failures += 1
        if lost is not None:
            lost(reason)
        await sleep(backoff.delay(failures))
