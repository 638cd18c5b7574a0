"""The child's side of :mod:`router.demo.channel`: messages in on stdin, out on stdout.

:func:`run_child` runs a child's ``serve(reader, send, gone)`` with stdin as a stream of
messages and a ``send`` that writes one message a line on its own copy of stdout; fd 1 then
becomes stderr, so that a stray print from a library cannot break a message line. ``gone`` is
set when the parent can no longer be written to: it is gone, and the child should stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, BinaryIO

from router.demo.channel import ChildMessage, encode
from router.telemetry.connection import cancel_and_wait

__all__ = ["Send", "run_child", "run_until_stopped"]

Send = Callable[[ChildMessage], None]
Serve = Callable[[asyncio.StreamReader, Send, asyncio.Event], Awaitable[int]]


def _sender(out: BinaryIO, gone: asyncio.Event) -> Send:
    def send(message: ChildMessage) -> None:
        try:
            out.write(encode(message))
            out.flush()
        except OSError:  # the parent is gone: nothing to report to, time to stop
            gone.set()

    return send


async def run_child(serve: Serve) -> int:
    """``serve``'s exit status, with the channel set up on stdin and stdout."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    gone = asyncio.Event()
    try:
        return await serve(reader, _sender(out, gone), gone)
    finally:
        with contextlib.suppress(OSError):  # the parent may be gone already
            out.close()


async def run_until_stopped(gone: asyncio.Event, *work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until one of them ends (reading stdin ends at its EOF: the parent closed
    it or died), ``gone`` is set, or SIGTERM or SIGINT comes; then cancel the rest."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, gone.set)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(w) for w in work]
    tasks.append(asyncio.create_task(gone.wait()))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            # How a task ended does not change the stop: what runs must stop whatever it was.
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
