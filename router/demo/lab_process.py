"""The demo's lab (:mod:`router.demo.lab`) seen from the console's process: a child process.

:class:`LabProcess` starts ``python -m router.demo.lab_child`` (the start, the stop and the
report of a child that dies are :class:`~router.demo.child_process.ChildProcess`'s), then
carries the load's start and stop and reads its tally (:mod:`router.demo.channel`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from router.demo.channel import (
    ChildMessage,
    ClientTally,
    LabPlan,
    LabReady,
    LoadStopped,
    StartLoad,
    StopLoad,
)
from router.demo.child_process import ChildLostError, ChildProcess, fail, settle

__all__ = ["ChildLostError", "LabProcess"]

_LOAD_STOP_S = 5.0
"""The lab's load stops within 2 s (drain included); the rest is slack for a busy machine."""


class LabProcess(ChildProcess[LabReady]):
    """The lab in a child process; the same calls as :class:`~router.demo.lab.Lab`."""

    module = "router.demo.lab_child"
    holds = "emulated fleet, node agents, load"
    name = "lab"
    ready_type = LabReady

    def __init__(self, plan: LabPlan, on_lost: Callable[[str], None] | None = None) -> None:
        super().__init__(plan, on_lost)
        self._load_stopped: asyncio.Future[ClientTally] | None = None
        self._tally = ClientTally()

    def start_load(self, front_url: str, start_at: float) -> None:
        self.send(StartLoad(front_url, start_at))

    def tally(self) -> ClientTally:
        """The load's tally as the child last sent it."""
        return self._tally

    async def stop_load(self) -> ClientTally:
        """Stop the load and wait for its final tally; the last one known if the child is
        gone or does not answer in time."""
        if not self.running or self.lost is not None:
            return self._tally
        self._load_stopped = asyncio.get_running_loop().create_future()
        self.send(StopLoad())
        with contextlib.suppress(TimeoutError, ChildLostError):
            return await asyncio.wait_for(self._load_stopped, _LOAD_STOP_S)
        return self._tally

    def received(self, message: ChildMessage) -> None:
        if isinstance(message, ClientTally):
            self._tally = message
        elif isinstance(message, LoadStopped):
            self._tally = message.tally
            settle(self._load_stopped, message.tally)

    def ended(self, error: ChildLostError) -> None:
        fail(self._load_stopped, error)
