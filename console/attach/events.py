"""The attached router's audit trail, followed across dropped connections.

:func:`follow_events` reads ``GET /admin/events?follow=1`` and, when the stream ends or the
connection drops, opens it again after a backoff with ``since`` set to the last event it
delivered: nothing is missed, nothing is delivered twice. A router that restarted numbers its
events from 1 again under a new run id: the stream names its run, ``since`` is sent with the
run it counts in (the router then answers its whole trail), and the cursor starts over. The
stream and the sleep are passed in, so the resumption is tested without sockets or clocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from console.attach.link import Backoff
from console.attach.rebuild import rebuild
from router.control import Event
from router.errors import GpuRouterError

__all__ = ["EventCursor", "OpenStream", "Opened", "follow_events"]


@dataclass(frozen=True, slots=True)
class Opened:
    """What a stream says before its events: the run its sequence numbers count in (None
    from a router that does not name one)."""

    run: str | None


OpenStream = Callable[[int, str | None], AsyncIterator[Opened | dict[str, Any]]]
"""Opens the trail after a sequence number counted in a run: ``AsyncAdmin.follow``."""


@dataclass(slots=True)
class EventCursor:
    """The newest event delivered, in the router's run; later ones only, each once."""

    since: int = 0
    run: str | None = None

    def accept(self, event: Event) -> bool:
        if event.seq <= self.since:
            return False
        self.since = event.seq
        return True

    def opened(self, run: str | None) -> bool:
        """The stream's run; True when it is another than the cursor's: the router restarted
        and numbers its events from 1 again, so every event of its run is new."""
        if run is None or run == self.run:
            return False
        known, self.run = self.run, run
        if known is None:
            return False  # the first run heard of: nothing to start over
        self.since = 0
        return True


async def follow_events(
    open_stream: OpenStream,
    cursor: EventCursor,
    deliver: Callable[[Event], None],
    *,
    sleep: Callable[[float], Awaitable[None]],
    backoff: Backoff | None = None,
    lost: Callable[[str], None] | None = None,
    restarted: Callable[[str], None] | None = None,
) -> None:
    """Deliver every event after ``cursor.since``, for ever (until cancelled); ``restarted``
    hears the new run of a router that restarted, before its events are delivered."""
    backoff = backoff or Backoff()
    failures = 0
    while True:
        try:
            async for data in open_stream(cursor.since, cursor.run):
                failures = 0  # it answered: a later drop starts the backoff again
                if isinstance(data, Opened):
                    if cursor.opened(data.run) and restarted is not None and data.run:
                        restarted(data.run)
                    continue
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
