"""One engine of a lab: its process tree, started pinned to a core in a session of its own,
waited for until ready, and stopped (or frozen, or crashed, for tests) exactly.

Nothing here blocks on more than one engine: ``wait_ready`` waits for several at once, so a
lab's engines start side by side.
"""

from __future__ import annotations

import http.client
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.lab.child_env import child_env
from router.lab.engine_kind import ServeOptions
from router.lab.engine_log import error_line
from router.lab.environment import LabEnvironment
from router.lab.errors import EngineStartError, LabError
from router.lab.processes import ProcessInfo, read_process, session_members, signal_processes

__all__ = ["DEFAULT_READY_S", "Engine", "EngineRecord", "free_port", "wait_ready"]

_POLL_S = 0.5
DEFAULT_READY_S = 300.0
"""A generous wait for an engine's ``/health`` (about 25 s on an idle machine)."""
_STOP_GRACE_S = 20.0
"""How long a stopped engine may take to exit on SIGTERM before it is killed."""
_KILL_WAIT_S = 10.0
"""A process stuck in the kernel outlives SIGKILL for a while; past this, say so."""


@dataclass(slots=True)
class EngineRecord:
    """What identifies one engine, on disk (``state.json``) and in memory."""

    name: str
    port: int
    core: int
    model_dir: str
    served_model: str
    log: str
    pid: int | None = None
    """Its session's leader (the session id); None before it starts."""
    start_ticks: int | None = None
    """The leader's start time, to know the pid was not reused."""


def free_port() -> int:
    """A loopback port free at the time of asking."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Engine:
    """One engine's process tree. ``start`` it, ``wait_ready``, ``stop`` it."""

    def __init__(self, record: EngineRecord, environment: LabEnvironment, options: ServeOptions):
        self.record = record
        self.environment = environment
        self.options = options
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123`` (``/v1/...`` below it)."""
        return f"http://127.0.0.1:{self.record.port}"

    @property
    def model(self) -> str:
        """The name it serves its model under."""
        return self.record.served_model

    @property
    def model_dir(self) -> Path:
        return Path(self.record.model_dir)

    @property
    def core(self) -> int:
        return self.record.core

    @property
    def log(self) -> Path:
        return Path(self.record.log)

    def argv(self) -> list[str]:
        """The whole command: pinned to its core, the launcher, the kind's serve arguments."""
        kind, env = self.environment.kind, self.environment
        serve = kind.serve_args(self.model_dir, self.model, self.record.port, self.options)
        return ["taskset", "-c", str(self.core), str(env.python), str(env.launcher), *serve]

    def start(self) -> None:
        """Start it (not waiting for it to be ready); LabError if it is already running."""
        if self.members():
            raise LabError(f"engine {self.name} is already running (pid {self.record.pid})")
        env = child_env(self.environment.kind.serve_env(self.core, self.options))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own session: stopping it stops exactly its tree
            )
        info = read_process(self._process.pid)
        self.record.pid = self._process.pid
        self.record.start_ticks = info.start_ticks if info is not None else None

    def members(self) -> list[ProcessInfo]:
        """Its live processes (API server, engine core, workers)."""
        if self._process is not None:
            self._process.poll()  # reap our own child, so a dead leader is not a zombie
        if self.record.pid is None:
            return []
        return session_members(self.record.pid, self.record.start_ticks)

    def running(self) -> bool:
        """Whether its leader, the API server, is alive."""
        return any(p.pid == self.record.pid for p in self.members())

    def healthy(self) -> bool:
        """Whether ``/health`` answers 200 within a second (a frozen engine still does)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.record.port, timeout=1.0)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def core_process(self) -> ProcessInfo:
        """Its compute process (vLLM's ``VLLM::EngineCore``); LabError if it has none."""
        title = self.environment.kind.core_title
        for info in self.members():
            if info.title.startswith(title):
                return info
        raise LabError(f"engine {self.name} has no {title} process")

    def freeze(self) -> None:
        """Stop its compute process (SIGSTOP), as a hung GPU leaves it: the API server still
        answers ``/health`` while nothing is generated. Returns once /proc says it stopped."""
        core = self.core_process()
        signal_processes([core], signal.SIGSTOP)
        _settle(lambda: (p := read_process(core.pid)) is None or p.state == "T")

    def thaw(self) -> None:
        """Resume what ``freeze`` stopped (SIGCONT to each of its stopped processes); returns
        once none reads stopped."""
        signal_processes([p for p in self.members() if p.state == "T"], signal.SIGCONT)
        _settle(lambda: all(p.state != "T" for p in self.members()))

    def kill_core(self) -> None:
        """Kill its compute process (SIGKILL), as a crash would."""
        signal_processes([self.core_process()], signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM to its whole tree, not waiting: what an orchestrator's stop does."""
        members = self.members()
        signal_processes(members, signal.SIGTERM)
        signal_processes(members, signal.SIGCONT)  # a frozen process must run to exit

    def stop(self, grace_s: float = _STOP_GRACE_S) -> bool:
        """End its whole tree: SIGTERM, then SIGKILL after ``grace_s``. False if nothing ran."""
        if not self.members():
            return False
        self.terminate()
        deadline = time.monotonic() + grace_s
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_processes(self.members(), signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT_S
        while (left := self.members()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            pids = ", ".join(str(p.pid) for p in left)
            raise LabError(f"engine {self.name}: processes {pids} outlived SIGKILL")
        return True

    def restart(self, timeout_s: float = DEFAULT_READY_S) -> None:
        """Stop it if it runs, start it again on the same port and core, wait until ready."""
        self.stop()
        self.start()
        wait_ready([self], timeout_s)

    def start_failure(self, why: str) -> EngineStartError:
        try:
            line = error_line(self.log.read_text(errors="replace"))
        except OSError:
            line = "(no log)"
        return EngineStartError(
            f"engine {self.name} (port {self.record.port}, core {self.core}) {why}:\n"
            f"  {line}\n  whole log: {self.log}"
        )


def wait_ready(engines: Sequence[Engine], timeout_s: float) -> None:
    """Wait until every engine answers ``/health``. On one that exits or is not ready within
    ``timeout_s``, stop them all and raise EngineStartError with its own error line."""
    waiting = list(engines)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for engine in list(waiting):
            failure = None
            if not engine.running():
                failure = engine.start_failure("exited before it was ready")
            elif engine.healthy():
                waiting.remove(engine)
            elif time.monotonic() > deadline:
                failure = engine.start_failure(f"was not ready after {timeout_s:g} s")
            if failure is not None:
                for other in engines:
                    other.stop()
                raise failure
        if waiting:
            time.sleep(_POLL_S)


SETTLE_S = 2.0
"""Longest wait for a signal to show in /proc: delivery is asynchronous, and a state read
at once still said "running" about one time in three on a busy machine."""


def _settle(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)
