"""The supervisor of ``gpurouter serve --workers N``: binds the service's sockets once, starts
N worker processes on them, restarts one that dies, serves the one admin API, and on SIGTERM
or SIGINT has every worker drain and waits for them.

- **One front-door socket, inherited.** The supervisor binds and listens; every worker accepts
  on that same socket (its descriptor is passed down). All workers share one accept queue,
  so a connection the kernel completed is taken by whichever worker accepts next: one that
  dies leaves no connection stranded in a queue of its own (docs/decisions/0005).
- **The load table** (load_table.py) lives in an anonymous file whose descriptor each worker
  inherits too. The supervisor zeroes a dead worker's row once it has reaped it: that
  worker's requests died with it, and its siblings must stop counting them.
- **Restarts**: a worker that exits while the service runs is started again after a backoff
  (0.1 s, doubling to 5 s; back to 0.1 s once a worker has served 10 s), logged on stderr
  and counted in the table (``/metrics``, ``/admin/state``). It applies the service's desired
  state before it opens its front door: from the broker's retained messages with a control
  link, from the supervisor without one (service_commands.py).
- **Its own socket** (supervisor_api.py, ``<dir>/service.sock``): where a worker asks for
  the desired state as it starts, and where worker 0 gives the drains and splits of the
  rollouts it runs when there is no control link, so that every worker applies them.
- **Stopping**: SIGTERM or SIGINT is passed to every worker, which drains as ``gpurouter
  serve`` does (``server.shutdown_grace_s``); one still running well after that is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import uvicorn

from router.config.schema import FleetConfig
from router.http.server import EmbeddedUvicorn, ListenError, bind_listener
from router.telemetry.embedded_broker import EmbeddedBroker
from router.workers.load_table import LoadTable
from router.workers.service_admin import ServiceAdmin
from router.workers.service_commands import ServiceCommands
from router.workers.supervisor_api import SupervisorApi
from router.workers.worker import worker_argv
from router.workers.worker_client import WorkerClient, service_socket_path

__all__ = ["Supervisor", "WorkerFailedError"]

log = logging.getLogger("gpurouter.workers")

READY_WAIT_S = 60.0
"""How long the first start of every worker may take before the service gives up."""
BACKOFF_S = (0.1, 5.0)
"""A restart's first and longest wait."""
STEADY_S = 10.0
"""A worker that served this long before dying restarts after the first wait again."""
_KILL_AFTER_S = 10.0
"""Past the drain's grace, how long a worker may take to exit before it is killed."""


class WorkerFailedError(RuntimeError):
    """A worker exited before it first served: the service does not start."""


class Supervisor:
    def __init__(
        self,
        fleet: FleetConfig,
        config: Path,
        workers: int,
        *,
        listen: str,
        admin_listen: str,
        admin_token: str | None,
        telemetry: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        self.fleet = fleet
        self.config = config
        self.workers = workers
        self.listen = listen
        self.admin_listen = admin_listen
        self.admin_token = admin_token
        self.front_url = ""
        self.admin_url = ""
        self.telemetry = telemetry
        self.router_id = f"router-{uuid.uuid4().hex[:8]}"
        """The service's name to other routers; worker ``k`` is ``<router_id>-w<k>``."""
        self.broker_url: str | None = None
        """The broker the workers use, when telemetry runs."""
        self.notes: list[str] = []
        """What happened at start, one line each, for the log."""
        self.procs: list[asyncio.subprocess.Process | None] = [None] * workers
        self._stopping = False

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    async def run(self, started: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM or SIGINT (ListenError: a socket could not be bound;
        WorkerFailedError: a worker died before it first served)."""
        loop = asyncio.get_running_loop()
        signalled = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signalled.set)
        front = bind_listener(self.listen, "front door", "server.listen")
        try:
            admin = bind_listener(self.admin_listen, "admin API", "server.admin_listen")
        except ListenError:
            front.close()
            raise
        broker: EmbeddedBroker | None = None
        if self.telemetry and self.fleet.broker.url == "embedded":
            # One broker for the service: each worker starting its own would split it in N.
            broker = EmbeddedBroker()
            self.broker_url = await broker.start()
            self.notes.append(f"embedded MQTT broker on {self.broker_url}")
        if self.telemetry:
            self.notes.append(f"{self.workers} workers, control link as {self.router_id}-w0..")
        else:
            self.notes.append(f"{self.workers} workers; telemetry off (--no-telemetry)")
        table = LoadTable.create(self.workers, len(self.fleet.replicas))
        directory = Path(tempfile.mkdtemp(prefix="gpurouter-serve-"))  # mode 0700
        client = WorkerClient(directory, self.workers)
        commands = ServiceCommands(client, table, broadcast=not self.telemetry)
        admin_server: EmbeddedUvicorn | None = None
        admin_task: asyncio.Task[None] | None = None
        own_server: EmbeddedUvicorn | None = None
        own_task: asyncio.Task[None] | None = None
        keepers: list[asyncio.Task[None]] = []
        try:
            own = _unix_listener(service_socket_path(directory))
            own_server, own_task = await _serve_admin(SupervisorApi(commands), own)
            spawn = _Spawner(self, front, table, directory)
            for i in range(self.workers):
                await spawn(i)
            await _wait_ready(self, table)
            keepers = [
                asyncio.create_task(self._keep(i, spawn, table, commands))
                for i in range(self.workers)
            ]
            app = ServiceAdmin(
                client, table, self.admin_token, broadcast=not self.telemetry, commands=commands
            )
            admin_server, admin_task = await _serve_admin(app, admin)
            self.front_url, self.admin_url = _url(front), _url(admin)
            if started is not None:
                started()
            await signalled.wait()
        finally:
            self._stopping = True
            await self._stop_workers()
            for task in keepers:
                task.cancel()
            for server, serving in ((admin_server, admin_task), (own_server, own_task)):
                if server is not None and serving is not None:
                    server.exit(0)
                    await serving
            await client.close()
            front.close()
            admin.close()
            table.close()
            os.close(table.fd)
            shutil.rmtree(directory, ignore_errors=True)
            if broker is not None:
                await broker.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _keep(
        self, index: int, spawn: _Spawner, table: LoadTable, commands: ServiceCommands
    ) -> None:
        """Restart worker ``index`` whenever it exits, until the service stops."""
        backoff = BACKOFF_S[0]
        loop = asyncio.get_running_loop()
        while True:
            proc = self.procs[index]
            assert proc is not None
            began = loop.time()
            code = await proc.wait()
            table.clear(index)  # its requests died with it: siblings stop counting them
            commands.gone(index)
            if self._stopping:
                return
            if loop.time() - began >= STEADY_S:
                backoff = BACKOFF_S[0]
            log.warning(
                "worker %d (pid %d) exited with %s; restarting in %.1f s",
                index,
                proc.pid,
                code,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S[1])
            table.restarted(index)
            await spawn(index)

    async def _stop_workers(self) -> None:
        running = [p for p in self.procs if p is not None and p.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        wait = self.fleet.server.shutdown_grace_s + _KILL_AFTER_S
        for proc in running:
            try:
                await asyncio.wait_for(proc.wait(), wait)
            except TimeoutError:
                log.warning("worker pid %d did not stop in %.0f s; killing it", proc.pid, wait)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


class _Spawner:
    """Starts worker ``i`` on the service's inherited descriptors."""

    def __init__(
        self, sup: Supervisor, front: socket.socket, table: LoadTable, directory: Path
    ) -> None:
        self.sup = sup
        self.front = front
        self.table = table
        self.directory = directory

    async def __call__(self, index: int) -> None:
        sup = self.sup
        argv = worker_argv(
            sup.config, index, sup.workers, self.front.fileno(), self.table.fd, self.directory
        )
        if sup.telemetry:
            argv += ["--router-id", sup.router_id]
            if sup.broker_url is not None:
                argv += ["--broker", sup.broker_url]
        else:
            argv.append("--no-telemetry")
        self.sup.procs[index] = await asyncio.create_subprocess_exec(
            *argv,
            pass_fds=(self.front.fileno(), self.table.fd),
            stdin=asyncio.subprocess.DEVNULL,
            # A session of its own: a terminal's Ctrl-C reaches the supervisor alone, which
            # then stops the workers; a worker exiting on it first would be restarted.
            start_new_session=True,
        )


async def _wait_ready(sup: Supervisor, table: LoadTable) -> None:
    """Until every worker has written its pid (it serves); WorkerFailedError if one exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_WAIT_S
    while not all(table.pid(i) for i in range(sup.workers)):
        for i, proc in enumerate(sup.procs):
            if proc is not None and proc.returncode is not None:
                raise WorkerFailedError(
                    f"worker {i} exited with {proc.returncode} before it served"
                )
        if loop.time() >= deadline:
            raise WorkerFailedError(f"the workers did not all serve within {READY_WAIT_S:g} s")
        await asyncio.sleep(0.02)


def _unix_listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    return sock


async def _serve_admin(
    app: ServiceAdmin | SupervisorApi, sock: socket.socket
) -> tuple[EmbeddedUvicorn, asyncio.Task[None]]:
    config = uvicorn.Config(
        app, ws="none", lifespan="off", loop="none", access_log=False, log_config=None,
        log_level="warning", proxy_headers=False, server_header=False, date_header=False,
    )  # fmt: skip
    server = EmbeddedUvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await server.wait_started(task)
    return server, task


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
