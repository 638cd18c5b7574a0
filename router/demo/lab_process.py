"""The demo's lab (:mod:`router.demo.lab`) seen from the console's process: a child process.

:class:`LabProcess` starts ``python -m router.demo.lab_child`` in a session of its own, sends
it the plan and waits for it to be ready, then carries the load's start and stop and reads
its tally (:mod:`router.demo.lab_channel`). A child that ends without being asked is reported
once through ``on_lost`` with how it ended (its exit status or signal, and the last line it
wrote on stderr), and whatever waits on it is answered, never left hanging. :meth:`stop`
closes the child's stdin, which is how it is told to stop, and waits within a time limit,
then terminates it, then kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from router.demo.lab_channel import (
    ClientTally,
    LabFailed,
    LabMessage,
    LabPlan,
    LabReady,
    LoadStopped,
    StartLoad,
    StopLoad,
    decode,
    encode,
)
from router.errors import GpuRouterError
from router.telemetry.connection import cancel_and_wait

__all__ = ["LabLostError", "LabProcess"]

_START_TIMEOUT_S = 60.0
"""A lab that has not said it is ready by then is not coming (the capacity measurement and
the imports take a few seconds on a busy machine)."""
_LOAD_STOP_S = 5.0
"""The lab's load stops within 2 s (drain included); the rest is slack for a busy machine."""
_STOP_TIMEOUT_S = 8.0
"""The lab's own stop: load 2 s, agents 1.5 s, then the replicas' listeners."""
_KILL_TIMEOUT_S = 2.0
T = TypeVar("T")
_STDERR_TAIL = 4096
"""Bytes of the child's stderr kept, to say what it died of."""


class LabLostError(GpuRouterError):
    """The demo's lab process ended while the demo needed it."""


class LabProcess:
    """The lab in a child process; the same calls as :class:`~router.demo.lab.Lab`."""

    def __init__(self, plan: LabPlan, on_lost: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.on_lost = on_lost
        """Called once, with the reason, if the child ends before :meth:`stop`."""
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: asyncio.Future[LabReady] | None = None
        self._load_stopped: asyncio.Future[ClientTally] | None = None
        self._tally = ClientTally()
        self._stderr = b""
        self._stopping = False
        self.lost: str | None = None
        """Why the child ended unasked; None while it runs (or after a clean stop)."""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    async def start(self) -> LabReady:
        """Start the child and wait until the lab is ready. The child's own start error as
        it would be raised in this process (OSError for a port, GpuRouterError otherwise);
        LabLostError if it ended without saying why."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "router.demo.lab_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Out of the terminal's process group: Ctrl-C reaches the console, which stops
            # the lab in order, instead of killing both at once.
            start_new_session=True,
        )
        proc = self._proc
        assert proc.stdout is not None  # both asked for as pipes above
        assert proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read(proc, proc.stdout), name="demo-lab-channel"),
            asyncio.create_task(self._read_stderr(proc.stderr), name="demo-lab-stderr"),
        ]
        self._send(self.plan)
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), _START_TIMEOUT_S)
        except TimeoutError:
            await self.stop()
            raise GpuRouterError(
                f"the demo's lab process did not start within {_START_TIMEOUT_S:g} s"
            ) from None
        except BaseException:
            await self.stop()
            raise

    def start_load(self, front_url: str, start_at: float) -> None:
        self._send(StartLoad(front_url, start_at))

    def tally(self) -> ClientTally:
        """The load's tally as the child last sent it."""
        return self._tally

    async def stop_load(self) -> ClientTally:
        """Stop the load and wait for its final tally; the last one known if the child is
        gone or does not answer in time."""
        if self._proc is None or self._proc.returncode is not None or self.lost is not None:
            return self._tally
        self._load_stopped = asyncio.get_running_loop().create_future()
        self._send(StopLoad())
        with contextlib.suppress(TimeoutError, LabLostError):
            return await asyncio.wait_for(self._load_stopped, _LOAD_STOP_S)
        return self._tally

    async def stop(self) -> None:
        """Tell the child to stop (its stdin closes) and wait; terminate it, then kill it,
        if it has not ended within its limits. Idempotent."""
        self._stopping = True
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()  # a start given up: nobody waits for its answer any more
        proc = self._proc
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()
            await _end(proc)
        for task in self._tasks:
            # The readers end at the child's EOF; cancelled only if the pipes outlive it.
            done, _ = await asyncio.wait({task}, timeout=_KILL_TIMEOUT_S)
            if not done:
                await cancel_and_wait(task)
        self._tasks = []

    # ---- the channel ------------------------------------------------------------------------

    def _send(self, message: LabMessage) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return
        # A child that is gone is reported by the reader, from its EOF.
        with contextlib.suppress(ConnectionError):
            proc.stdin.write(encode(message))

    async def _read(self, proc: asyncio.subprocess.Process, out: asyncio.StreamReader) -> None:
        while line := await out.readline():
            try:
                message = decode(line)
            except ValueError:
                continue  # not from the channel: nothing to act on
            self._dispatch(message)
        await proc.wait()
        self._ended(proc)

    def _dispatch(self, message: LabMessage) -> None:
        if isinstance(message, LabReady):
            _settle(self._ready, message)
        elif isinstance(message, LabFailed):
            _fail(self._ready, _start_error(message))
        elif isinstance(message, ClientTally):
            self._tally = message
        elif isinstance(message, LoadStopped):
            self._tally = message.tally
            _settle(self._load_stopped, message.tally)

    async def _read_stderr(self, err: asyncio.StreamReader) -> None:
        while chunk := await err.read(_STDERR_TAIL):
            self._stderr = (self._stderr + chunk)[-_STDERR_TAIL:]

    def _ended(self, proc: asyncio.subprocess.Process) -> None:
        """The child's stdout closed: it has ended. Answer whatever waits on it; report it
        if it had started and was not asked to stop."""
        reason = self._reason(proc)
        error = LabLostError(reason)
        _fail(self._ready, error)  # before it was ready: the start raises this
        _fail(self._load_stopped, error)
        if self._stopping or not _succeeded(self._ready):
            return
        self.lost = reason
        if self.on_lost is not None:
            self.on_lost(reason)

    def _reason(self, proc: asyncio.subprocess.Process) -> str:
        code = proc.returncode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exit status {code}"
        said = [line for line in self._stderr.decode(errors="replace").splitlines() if line]
        last = f"; its last words: {said[-1].strip()}" if said else ""
        return (
            f"the demo's lab process (pid {proc.pid}: emulated fleet, node agents, load) "
            f"ended unexpectedly ({how}){last}"
        )


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Wait for ``proc`` within the stop limit, then terminate it, then kill it."""
    for limit, hurry in ((_STOP_TIMEOUT_S, proc.terminate), (_KILL_TIMEOUT_S, proc.kill)):
        try:
            await asyncio.wait_for(proc.wait(), limit)
            return
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                hurry()
    await proc.wait()


def _start_error(failed: LabFailed) -> Exception:
    """The child's start error as this process would have raised it."""
    if failed.kind == "os":
        error = OSError(failed.message)
        error.errno = failed.errno if failed.errno is not None else errno.EIO
        return error
    return GpuRouterError(failed.message)


def _settle(future: asyncio.Future[T] | None, value: T) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _succeeded(future: asyncio.Future[Any] | None) -> bool:
    return (
        future is not None
        and future.done()
        and not future.cancelled()
        and future.exception() is None
    )


def _fail(future: asyncio.Future[Any] | None, error: Exception) -> None:
    if future is not None and not future.done():
        future.set_exception(error)
