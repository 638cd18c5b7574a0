"""``python -m router.demo.lab_child``: the demo's lab in a process of its own.

Started by :class:`router.demo.lab_process.LabProcess`, it reads a :class:`LabPlan` on stdin,
starts the :class:`~router.demo.lab.Lab` and answers :class:`LabReady` (or
:class:`LabFailed`) on stdout, then obeys :class:`StartLoad` and :class:`StopLoad` and sends
the load's tally a few times a second (:mod:`router.demo.lab_channel`).

It stops, everything within its time limits, when its stdin closes: the parent closed it, or
the parent is gone (a crash, SIGKILL), since the kernel closes a dead process's end of the
pipe. So no lab outlives its console. SIGTERM and SIGINT stop it the same way; it runs in a
session of its own, so a Ctrl-C at the terminal reaches the parent only, which stops it in
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import BinaryIO

from router.demo.lab import Lab
from router.demo.lab_channel import (
    ClientTally,
    LabFailed,
    LabMessage,
    LabPlan,
    LoadStopped,
    StartLoad,
    StopLoad,
    decode,
    encode,
)
from router.errors import GpuRouterError
from router.telemetry.connection import cancel_and_wait

_TALLY_S = 0.25
"""How often the load's tally goes to the parent (when it changed): the headless lines and
the console read it once a second."""

Send = Callable[[LabMessage], None]


def _sender(out: BinaryIO, gone: asyncio.Event) -> Send:
    def send(message: LabMessage) -> None:
        try:
            out.write(encode(message))
            out.flush()
        except OSError:  # the parent is gone: nothing to report to, time to stop
            gone.set()

    return send


async def serve(reader: asyncio.StreamReader, out: BinaryIO) -> int:
    """Run one lab as the parent says; 0 after a stop, 1 if it could not start."""
    from router.config import load_fleet

    stop = asyncio.Event()
    send = _sender(out, stop)
    try:
        plan = decode(await reader.readline())
    except ValueError:
        return 1  # no plan: the parent went away before sending it
    if not isinstance(plan, LabPlan):
        return 1
    try:
        lab = Lab(load_fleet(plan.fleet_file), plan)
        send(await lab.start())
    except OSError as exc:
        send(LabFailed("os", str(exc), exc.errno))
        return 1
    except GpuRouterError as exc:
        send(LabFailed("config", str(exc)))
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks = [
        asyncio.create_task(_obey(reader, lab, send)),
        asyncio.create_task(_tallies(lab, send)),
        asyncio.create_task(_until(stop)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            # How a task ended does not change the stop; the lab must stop whatever it was.
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await lab.stop()
    return 0


async def _until(event: asyncio.Event) -> None:
    await event.wait()


async def _obey(reader: asyncio.StreamReader, lab: Lab, send: Send) -> None:
    """Carry out the parent's commands until its end of the pipe closes."""
    while line := await reader.readline():
        message = decode(line)
        if isinstance(message, StartLoad):
            lab.start_load(message.front_url, message.start_at)
        elif isinstance(message, StopLoad):
            send(LoadStopped(await lab.stop_load()))


async def _tallies(lab: Lab, send: Send) -> None:
    last: ClientTally | None = None
    while True:
        await asyncio.sleep(_TALLY_S)
        tally = lab.tally()
        if tally != last:
            send(tally)
            last = tally


async def _main() -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # The channel keeps its own copy of stdout; fd 1 becomes stderr, so that a stray print
    # from a library cannot break a message line.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        return await serve(reader, out)
    finally:
        with contextlib.suppress(OSError):  # the parent may be gone already
            out.close()


def main() -> int:
    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main())
