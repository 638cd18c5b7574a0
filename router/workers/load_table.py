"""The load table: every worker's own requests per replica, in memory all workers map.

One row per worker, one cell pair per replica (requests in flight, their outstanding cost),
and a few cells per worker that the supervisor keeps (pid, restarts). Each cell has one
writer: a worker writes its own row's load, the supervisor its bookkeeping cells and, once
it has reaped a dead worker, that worker's whole row (zeroed: its requests died with it). So
there are no locks. Readers may read while a writer writes:

- one cell is read whole: cells are 8-byte aligned and read and written as one 8-byte
  machine word (``memoryview`` items copy an aligned ``long long`` / ``double``), which
  64-bit CPUs load and store in one access;
- a row is not read as of one instant: a reader may see a worker's new in-flight count
  beside its old cost (or the other way round), off by that worker's latest request's cost
  until its next read. Nothing sums costs exactly across processes anyway: the next read
  after the writer's second store is right again.

The memory is an anonymous file (``memfd_create``, or an unlinked temporary file where there
is none) the supervisor creates and hands to each worker as an inherited descriptor: nothing
to name, nothing to unlink, gone when the last process holding it exits (a killed supervisor
leaves nothing behind, unlike a named ``multiprocessing.shared_memory`` block, whose resource
tracker in each child would unlink it when that child exits).
"""

from __future__ import annotations

import mmap
import os
import tempfile

__all__ = ["LoadTable"]

_MAGIC = 0x67707277_6B727331  # "gprwkrs1": what the supervisor wrote, in this layout
_HEADER_CELLS = 4  # magic, workers, replicas, reserved
_ROW_CELLS = 2  # pid, restarts: the supervisor's; then the worker's load cells
_PID, _RESTARTS = 0, 1


class LoadTable:
    """``workers`` rows of ``replicas`` (in flight, cost) pairs over one shared mapping."""

    def __init__(self, fd: int, workers: int, replicas: int, *, create: bool = False) -> None:
        """Map the table in ``fd``; ``create``: size it and write its header (the
        supervisor), else check that the header says the same shape (a worker)."""
        if workers < 1 or replicas < 0:
            raise ValueError(
                f"a load table needs workers >= 1, replicas >= 0: {workers}, {replicas}"
            )
        self.fd = fd
        self.workers = workers
        self.replicas = replicas
        self._row = _ROW_CELLS + 2 * replicas
        size = 8 * (_HEADER_CELLS + workers * self._row)
        if create:
            os.ftruncate(fd, size)
        elif os.fstat(fd).st_size != size:
            raise ValueError("the load table's size does not match this fleet and worker count")
        self._map = mmap.mmap(fd, size)
        self._ints = memoryview(self._map).cast("q")
        self._floats = memoryview(self._map).cast("d")
        if create:
            self._ints[1], self._ints[2] = workers, replicas  # the file starts zeroed
            self._ints[0] = _MAGIC
        elif tuple(self._ints[0:3]) != (_MAGIC, workers, replicas):
            raise ValueError("the load table's header does not match this fleet and worker count")

    @classmethod
    def create(cls, workers: int, replicas: int) -> LoadTable:
        """A new zeroed table in an anonymous file whose descriptor children may inherit."""
        fd = _anonymous_fd()
        os.set_inheritable(fd, True)
        return cls(fd, workers, replicas, create=True)

    def close(self) -> None:
        """Unmap (the views first: a mapping with live views cannot close)."""
        self._ints.release()
        self._floats.release()
        self._map.close()

    # ---- one worker's load (written by that worker only) --------------------------------

    def _cell(self, worker: int, replica: int) -> int:
        if not (0 <= worker < self.workers and 0 <= replica < self.replicas):
            raise IndexError(f"no cell for worker {worker}, replica {replica}")
        return _HEADER_CELLS + worker * self._row + _ROW_CELLS + 2 * replica

    def write(self, worker: int, replica: int, in_flight: int, cost: float) -> None:
        """Worker ``worker``'s own requests on ``replica`` now."""
        i = self._cell(worker, replica)
        self._ints[i] = in_flight
        self._floats[i + 1] = cost

    def read(self, worker: int, replica: int) -> tuple[int, float]:
        """Worker ``worker``'s figures for ``replica``, as last written."""
        i = self._cell(worker, replica)
        return self._ints[i], self._floats[i + 1]

    def others(self, worker: int, replica: int) -> tuple[int, float]:
        """Every other worker's requests on ``replica``, summed: what ``worker`` adds to its
        own accounting (never below zero: a cost half-written cannot make a figure negative)."""
        n, cost = 0, 0.0
        for w in range(self.workers):
            if w != worker:
                i = _HEADER_CELLS + w * self._row + _ROW_CELLS + 2 * replica
                n += self._ints[i]
                cost += self._floats[i + 1]
        return max(0, n), max(0.0, cost)

    def row(self, worker: int) -> list[tuple[int, float]]:
        """Every replica's figures in one worker's row."""
        return [self.read(worker, r) for r in range(self.replicas)]

    # ---- the supervisor's cells ----------------------------------------------------------

    def clear(self, worker: int) -> None:
        """Zero a worker's load (the supervisor, once that worker is reaped: its requests
        are gone) and its pid; its restart count stays."""
        self._ints[self._base(worker) + _PID] = 0
        for r in range(self.replicas):
            self.write(worker, r, 0, 0.0)

    def set_pid(self, worker: int, pid: int) -> None:
        """The worker's pid, written by the worker once it serves (0: not serving)."""
        self._ints[self._base(worker) + _PID] = pid

    def pid(self, worker: int) -> int:
        return self._ints[self._base(worker) + _PID]

    def restarted(self, worker: int) -> None:
        self._ints[self._base(worker) + _RESTARTS] += 1

    def restarts(self, worker: int) -> int:
        return self._ints[self._base(worker) + _RESTARTS]

    def _base(self, worker: int) -> int:
        if not 0 <= worker < self.workers:
            raise IndexError(f"no row for worker {worker}")
        return _HEADER_CELLS + worker * self._row


def _anonymous_fd() -> int:
    create = getattr(os, "memfd_create", None)
    if create is not None:
        return int(create("gpurouter-load", 0))  # not close-on-exec: children inherit it
    with tempfile.TemporaryFile() as f:  # unlinked at once where it can be
        return os.dup(f.fileno())
