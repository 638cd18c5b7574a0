"""The asyncio driver of the router core: tickets for handlers, timers for the core.

The core is synchronous and knows nothing of tasks. A request handler submits through
:meth:`AsyncRouter.submit` and gets a :class:`Ticket`; the core's events about that request
(an assignment to try, or the request's ending) arrive on the ticket in order. When the core
cancels an attempt (preemption), the ticket's ``on_cancel`` hook lets the handler stop its
upstream call. Timers expire deadlines and run the adaptive tuners; a timer whose step raises
logs it and keeps running (the tuners' changes themselves reach the audit trail through the
control surface, a listener of the core like this driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable

from router.core import Assignment, CoreListener, Finished, RouterCore
from router.request import Request

Event = Assignment | Finished

log = logging.getLogger(__name__)


class Ticket:
    """One request's events, in order, for the handler that serves it.

    A deque and at most one waiting future: cheaper than an ``asyncio.Queue`` per request,
    which matters on the hot path.
    """

    __slots__ = ("_events", "_waiter", "attempt_cancelled", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.attempt_cancelled: Callable[[Assignment], None] | None = None
        """Set by the handler while an attempt runs; called when the core cancels it."""

    def push(self, event: Event) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> Event:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()

    def next_nowait(self) -> Event | None:
        return self._events.popleft() if self._events else None


class AsyncRouter(CoreListener):
    def __init__(self, core: RouterCore, *, expire_every_s: float = 0.05) -> None:
        self.core = core
        self.expire_every_s = expire_every_s
        self._tickets: dict[str, Ticket] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.timer_failures: Counter[str] = Counter()
        """Per timer (``expire``, ``tune``), the steps that raised since start."""
        core.listeners.append(self)

    # ---- for handlers ----------------------------------------------------------------------

    def submit(self, request: Request) -> Ticket:
        """Hand a request to the core; its events arrive on the returned ticket."""
        ticket = Ticket(request)
        self._tickets[request.id] = ticket
        self.core.submit(request)
        return ticket

    def forget(self, request_id: str) -> None:
        """The handler is done with a request (after its ending)."""
        self._tickets.pop(request_id, None)

    def abandon(self, ticket: Ticket, reason: str = "cancelled by client") -> None:
        """The client went away: end the request wherever it is."""
        self.core.cancel(ticket.request.id, reason)
        self.forget(ticket.request.id)

    # ---- core listener ---------------------------------------------------------------------

    def on_assign(self, assignment: Assignment) -> None:
        ticket = self._tickets.get(assignment.request.id)
        if ticket is not None:
            ticket.push(assignment)

    def on_finish(self, finished: Finished) -> None:
        ticket = self._tickets.get(finished.request.id)
        if ticket is not None:
            ticket.push(finished)

    def on_cancel(self, assignment: Assignment) -> None:
        ticket = self._tickets.get(assignment.request.id)
        if ticket is not None and ticket.attempt_cancelled is not None:
            ticket.attempt_cancelled(assignment)

    # ---- timers ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the timers on the running loop."""
        expire = self._every("expire", self.expire_every_s, self.core.expire)
        self._tasks.append(asyncio.create_task(expire, name="router-expire"))
        adaptive = self.core.settings.adaptive
        if adaptive.weights or adaptive.batch_sizes:
            # What changed needs no handling here: the core tells its listeners (on_tune).
            tune = self._every("tune", adaptive.interval_s, self.core.tune)
            self._tasks.append(asyncio.create_task(tune, name="router-tune"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def _every(self, name: str, interval_s: float, step: Callable[[], object]) -> None:
        """Run ``step`` every ``interval_s``; one that raises is counted and logged (the 1st,
        2nd, 4th, 8th... failure, so a step failing each round cannot flood the log), and the
        timer goes on."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                step()
            except Exception:
                self.timer_failures[name] += 1
                n = self.timer_failures[name]
                if n & (n - 1) == 0:
                    log.exception(
                        "router %s timer: step failed (%d so far); still running", name, n
                    )
