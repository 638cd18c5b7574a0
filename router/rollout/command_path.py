"""How a rollout's drains, readmissions, preemptions and traffic splits reach the routers: the
path an operator's command takes (docs/decisions/0007-rollouts-across-workers.md).

On a router alone (the console's, a test's, ``gpurouter serve --no-telemetry`` with one
worker) a command is applied to the router's own control surface at once, as an operator's
is there. Where the router gives an operator's command to more than itself (``gpurouter
serve`` publishes it over its control link as the cluster's desired state; a worker of
``serve --workers N --no-telemetry`` has its supervisor give it to every worker), the server
sets :attr:`CommandPath.apply` to that same function, and a rollout's commands take it: every
router of the cluster and every worker of the service applies them, and one that starts later
gets them back as it gets the operator's.

Commands sent through one path are applied one at a time, in the order given: a canary's share
set from synchronous code (:meth:`send`) cannot overtake a drain awaited before it
(:meth:`run`). A command the path could not deliver (the broker did not bring it back in
time, the supervisor did not answer) is a refusal in the audit trail, never an exception; so
is one the control link, being down, applied on this router alone: a rollout stops on it
(readmitting what it drained) rather than update a replica the others still send to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from router.control import (
    Applied,
    Command,
    ControlSurface,
    Event,
    command_args,
    command_name,
)
from router.errors import GpuRouterError

__all__ = ["Apply", "CommandPath"]

log = logging.getLogger("gpurouter.rollout")

Apply = Callable[[Command, str], Awaitable[Applied]]
"""Applies a command given as an actor, wherever it must go; this router's own application."""


class CommandPath:
    def __init__(self, control: ControlSurface) -> None:
        self.control = control
        self.apply: Apply | None = None
        """How an operator's command given to this router is applied (the admin API's
        ``apply``); None: on this router alone, at once."""
        self._queue: deque[tuple[Command, str, asyncio.Future[Event]]] = deque()
        self._last: asyncio.Future[Event] | None = None
        self._current: asyncio.Future[Event] | None = None
        """The waiter of the command being applied now."""
        self._task: asyncio.Task[None] | None = None

    def send(self, command: Command, actor: str) -> None:
        """Apply ``command`` as ``actor``: at once on a router alone, else after the commands
        sent before it (for synchronous callers: a canary's step, a blue-green switch)."""
        if self.apply is None:
            self.control.apply(command, actor=actor)
            return
        self._enqueue(command, actor)

    async def run(self, command: Command, actor: str) -> Event:
        """Apply ``command`` as ``actor`` after those sent before it; this router's event."""
        if self.apply is None:
            return self.control.apply(command, actor=actor)
        return await self._enqueue(command, actor)

    async def settled(self) -> None:
        """Until every command sent so far has been applied here (or refused)."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait([last])  # cancelled or not, it is settled

    async def close(self) -> None:
        """Stop applying (the router is stopping); commands still queued are dropped."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._current is not None:
            self._current.cancel()
        while self._queue:
            self._queue.popleft()[2].cancel()

    def _enqueue(self, command: Command, actor: str) -> asyncio.Future[Event]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Event] = loop.create_future()
        self._queue.append((command, actor, done))
        self._last = done
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._apply_queued(), name="rollout-commands")
        return done

    async def _apply_queued(self) -> None:
        while self._queue:
            command, actor, done = self._queue.popleft()
            self._current = done
            event = await self._apply_one(command, actor)
            if not done.done():  # its waiter may have been cancelled (the rollout stopped)
                done.set_result(event)
            self._current = None

    async def _apply_one(self, command: Command, actor: str) -> Event:
        apply = self.apply
        try:
            if apply is None:  # set back to this router alone meanwhile
                return self.control.apply(command, actor=actor)
            applied = await apply(command, actor)
            if applied.routers is not None or not applied.event.ok:
                return applied.event
            # The control link is down: the operator's path applied it here and told nobody.
            # A rollout must not go on as if the others held its drain.
            why = "applied on this router alone (the control link is down): no other was told"
        except TimeoutError:
            why = "it was published but did not come back from the broker in time"
        except GpuRouterError as exc:
            why = str(exc)
        except Exception as exc:  # a lost connection mid-publish: never a rollout left waiting
            why = f"{type(exc).__name__}: {exc}"
        name, args = command_name(command), command_args(command)
        message = f"{name} not given to every router: {why}"
        log.warning("%s (actor %s)", message, actor)
        self.control.note(actor, name, args, False, message)
        return Event(0, self.control.wall_clock(), actor, name, args, False, message)
