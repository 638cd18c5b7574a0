"""One of the demo's children seen from the console's process: the lab or the router.

:class:`ChildProcess` starts ``python -m <module>`` in a session of its own, sends it its plan
and waits for it to say it is ready (:mod:`router.demo.channel`). A child that ends without
being asked is reported once through ``on_lost`` with how it ended (its exit status or
signal, and the last line it wrote on stderr), and whatever waits on it is answered, never
left hanging. :meth:`ChildProcess.stop` closes the child's stdin, which is how it is told to
stop, and waits within a time limit, then terminates it, then kills it. Subclasses name the
module, say what the child holds, and handle the messages of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from router.demo.channel import ChildMessage, StartFailed, decode, encode
from router.errors import GpuRouterError
from router.telemetry.connection import cancel_and_wait

__all__ = ["ChildLostError", "ChildProcess", "fail", "settle"]

_START_TIMEOUT_S = 60.0
"""A child that has not said it is ready by then is not coming (the capacity measurement and
the imports take a few seconds on a busy machine)."""
_STOP_TIMEOUT_S = 8.0
"""A child's own stop: the lab's load 2 s, agents 1.5 s, then the replicas' listeners; the
router's subscriber, then half a second of grace for its requests."""
_KILL_TIMEOUT_S = 2.0
_STDERR_TAIL = 4096
"""Bytes of the child's stderr kept, to say what it died of."""

T = TypeVar("T")
R = TypeVar("R")


class ChildLostError(GpuRouterError):
    """One of the demo's child processes ended while the demo needed it."""


class ChildProcess(Generic[R]):
    """A child that reads a plan, answers ``ready`` (of type ``R``), and runs until its
    stdin closes."""

    module: str
    """What ``python -m`` runs."""
    holds: str
    """What the child holds, for the operator: ``emulated fleet, node agents, load``."""
    name: str
    """``lab`` or ``router``."""
    ready_type: type[R]

    def __init__(self, plan: ChildMessage, on_lost: Callable[[str], None] | None = None) -> None:
        self.plan = plan
        self.on_lost = on_lost
        """Called once, with the reason, if the child ends before :meth:`stop`."""
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: asyncio.Future[R] | None = None
        self._stderr = b""
        self._stopping = False
        self.lost: str | None = None
        """Why the child ended unasked; None while it runs (or after a clean stop)."""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """Started, and neither ended nor being stopped."""
        proc = self._proc
        return proc is not None and proc.returncode is None and not self._stopping

    async def start(self) -> R:
        """Start the child and wait until it is ready. The child's own start error as it
        would be raised in this process (OSError for a port, GpuRouterError otherwise);
        ChildLostError if it ended without saying why."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # Out of the terminal's process group: Ctrl-C reaches the console, which stops
            # its children in order, instead of killing them all at once.
            start_new_session=True,
        )
        proc = self._proc
        assert proc.stdout is not None  # both asked for as pipes above
        assert proc.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read(proc, proc.stdout), name=f"demo-{self.name}-channel"),
            asyncio.create_task(self._read_stderr(proc.stderr), name=f"demo-{self.name}-stderr"),
        ]
        self.send(self.plan)
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), _START_TIMEOUT_S)
        except TimeoutError:
            await self.stop()
            raise GpuRouterError(
                f"the demo's {self.name} process did not start within {_START_TIMEOUT_S:g} s"
            ) from None
        except BaseException:
            await self.stop()
            raise

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

    def send(self, message: ChildMessage) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return
        # A child that is gone is reported by the reader, from its EOF.
        with contextlib.suppress(ConnectionError):
            proc.stdin.write(encode(message))

    def received(self, message: ChildMessage) -> None:
        """A message other than ready or failed, for the subclass to act on."""

    def ended(self, error: ChildLostError) -> None:
        """The child has ended: a subclass answers whatever of its own waits on it."""

    async def _read(self, proc: asyncio.subprocess.Process, out: asyncio.StreamReader) -> None:
        while line := await out.readline():
            try:
                message = decode(line)
            except ValueError:
                continue  # not from the channel: nothing to act on
            if isinstance(message, self.ready_type):
                settle(self._ready, message)
            elif isinstance(message, StartFailed):
                fail(self._ready, _start_error(message))
            else:
                self.received(message)
        await proc.wait()
        self._ended(proc)

    async def _read_stderr(self, err: asyncio.StreamReader) -> None:
        while chunk := await err.read(_STDERR_TAIL):
            self._stderr = (self._stderr + chunk)[-_STDERR_TAIL:]

    def _ended(self, proc: asyncio.subprocess.Process) -> None:
        """The child's stdout closed: it has ended. Answer whatever waits on it; report it
        if it had started and was not asked to stop."""
        reason = self._reason(proc)
        error = ChildLostError(reason)
        fail(self._ready, error)  # before it was ready: the start raises this
        self.ended(error)
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
            f"the demo's {self.name} process (pid {proc.pid}: {self.holds}) "
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


def _start_error(failed: StartFailed) -> Exception:
    """The child's start error as this process would have raised it."""
    if failed.kind == "os" and failed.listener and failed.address and failed.setting:
        from router.http.server import ListenError

        cause = OSError(failed.errno or errno.EIO, failed.message)
        return ListenError(failed.listener, failed.address, failed.setting, cause)
    if failed.kind == "os":
        error = OSError(failed.message)
        error.errno = failed.errno if failed.errno is not None else errno.EIO
        return error
    return GpuRouterError(failed.message)


def settle(future: asyncio.Future[T] | None, value: T) -> None:
    """Answer ``future`` with ``value`` unless it is answered already (or absent)."""
    if future is not None and not future.done():
        future.set_result(value)


def fail(future: asyncio.Future[Any] | None, error: Exception) -> None:
    """Answer ``future`` with ``error`` unless it is answered already (or absent)."""
    if future is not None and not future.done():
        future.set_exception(error)


def _succeeded(future: asyncio.Future[Any] | None) -> bool:
    return (
        future is not None
        and future.done()
        and not future.cancelled()
        and future.exception() is None
    )
