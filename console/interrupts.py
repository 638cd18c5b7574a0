"""Ctrl+C on the command line: one line saying so, what was done so far, exit 130.

Commands that end on their own (``run``, ``sim``, ``config``, ``strategies``, ``ctl``) exit
:data:`EXIT_INTERRUPTED` when interrupted, after printing the part of their report they have.
Commands that run until stopped (``serve``, ``emulate``, ``agent``, ``broker``, ``console``,
``demo``) take Ctrl+C as their way to stop: they shut down cleanly and exit 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import TextIO

__all__ = ["EXIT_INTERRUPTED", "deferred", "interrupted", "silence"]

EXIT_INTERRUPTED = 130
"""128 + SIGINT: what a shell reports for a command that Ctrl+C ended."""


def interrupted(prog: str, err: TextIO, detail: str = "") -> int:
    """Say on one line that ``prog`` was interrupted (and where); return the exit code."""
    err.write(f"{prog}: interrupted{': ' + detail if detail else ''}\n")
    err.flush()
    return EXIT_INTERRUPTED


def silence(out: TextIO) -> None:
    """Point ``out`` at /dev/null after its reader went away (``| head``), so that the
    interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError):  # no file descriptor (a StringIO): nothing left to flush
        pass


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Ctrl+C inside the block takes effect at its end: what the block prints and what it
    counts stay in step (a row printed is a row counted)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt
