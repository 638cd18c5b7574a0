"""``python -m router.demo.lab_child``: the demo's lab in a process of its own.

Started by :class:`router.demo.lab_process.LabProcess`, it reads a :class:`LabPlan` on stdin,
starts the :class:`~router.demo.lab.Lab` and answers :class:`LabReady` (or
:class:`StartFailed`) on stdout, then obeys :class:`StartLoad` and :class:`StopLoad` and sends
the load's tally a few times a second (:mod:`router.demo.channel`).

It stops, everything within its time limits, when its stdin closes: the parent closed it, or
the parent is gone (a crash, SIGKILL), since the kernel closes a dead process's end of the
pipe. So no lab outlives its console. SIGTERM and SIGINT stop it the same way; it runs in a
session of its own, so a Ctrl-C at the terminal reaches the parent only, which stops it in
order.
"""

from __future__ import annotations

import asyncio
import sys

from router.demo.channel import (
    ClientTally,
    LabPlan,
    LoadStopped,
    StartFailed,
    StartLoad,
    StopLoad,
    decode,
)
from router.demo.child_io import Send, run_child, run_until_stopped
from router.demo.lab import Lab
from router.errors import GpuRouterError

_TALLY_S = 0.25
"""How often the load's tally goes to the parent (when it changed): the headless lines and
the console read it once a second."""


async def serve(reader: asyncio.StreamReader, send: Send, stop: asyncio.Event) -> int:
    """Run one lab as the parent says; 0 after a stop, 1 if it could not start."""
    from router.config import load_fleet

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
        send(StartFailed("os", str(exc), exc.errno))
        return 1
    except GpuRouterError as exc:
        send(StartFailed("config", str(exc)))
        return 1
    try:
        await run_until_stopped(stop, _obey(reader, lab, send), _tallies(lab, send))
    finally:
        await lab.stop()
    return 0


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


def main() -> int:
    return asyncio.run(run_child(serve))


if __name__ == "__main__":
    sys.exit(main())
