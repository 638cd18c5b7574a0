"""RouterServer: the whole data plane of one router, on the caller's event loop.

It composes the core, the control surface, the asyncio driver, the upstream pool, health
checking, metrics, the front door and the admin API, and runs both listeners with uvicorn
(httptools, no lifespan, no access log) inside the running loop. ``gpurouter serve`` runs it
headless under uvloop; the console and the demo embed it in their own loop.

``start()`` installs no signal handlers (the console's app owns the loop's signals); only
``serve_forever()`` does, for the serve command: SIGTERM or SIGINT stop accepting, let
in-flight requests finish within ``server.shutdown_grace_s``, cancel the rest, and return.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import random
import signal
import socket
from collections.abc import Awaitable, Callable, Generator

import uvicorn

from router.capacity_prior import ProcessFitter
from router.clock import Clock, monotonic
from router.config.schema import FleetConfig
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import ConfigError, Problem
from router.http.admin import AdminApi
from router.http.app import FrontDoor
from router.http.asgi import Receive, Scope, Send
from router.http.driver import AsyncRouter
from router.http.errors import HttpError
from router.http.guard import ConnectionLimits, GuardedProtocol, Refused, guarded_protocol
from router.http.health import HealthMonitor
from router.http.metrics import RouterMetrics
from router.http.proxy import Proxy
from router.http.responses import ADMIN_CONNECTION_ROUTE, CONNECTION_ROUTE
from router.http.served_models import ServedModels
from router.http.upstream import Upstream
from router.rollout.command_path import Apply
from router.rollout.manager import RolloutManager
from router.telemetry.engine_metrics import EngineMetricsPoller
from router.telemetry.status import TelemetryStatus

__all__ = [
    "EmbeddedUvicorn",
    "ListenError",
    "RouterServer",
    "bind_listener",
    "is_loopback",
    "split_host_port",
    "uvicorn_config",
]

_HANDLER_WAIT_S = 2.0
"""After the grace, how long cancelled handlers get to unwind before the pool closes."""
_SHUTTING_DOWN = HttpError(
    503, "the router is shutting down", "server_error", code="shutting_down", retry_after_s=1
)


class RouterServer:
    def __init__(
        self,
        fleet: FleetConfig,
        *,
        listen: str | None = None,
        admin_listen: str | None = None,
        admin_token: str | None = None,
        telemetry: Callable[[], TelemetryStatus] | None = None,
        clock: Clock = monotonic,
        rng: random.Random | None = None,
        front_socket: socket.socket | None = None,
        admin_socket: socket.socket | None = None,
    ) -> None:
        """``front_socket``: a listening socket to serve the front door on instead of binding
        ``listen`` (a worker of ``gpurouter serve --workers``, which inherits its
        supervisor's); ``admin_socket``: the same for the admin API, which is then private
        (no token: whoever can open that socket is the service itself)."""
        self.fleet = fleet
        self._front_socket = front_socket
        self._admin_socket = admin_socket
        self.listen = listen or fleet.server.listen
        self.admin_listen = admin_listen or fleet.server.admin_listen
        env = fleet.server.admin_token_env
        if admin_token is None and env:
            admin_token = os.environ.get(env) or None
        if admin_socket is None:
            self.check_admin_address(fleet, self.admin_listen, admin_token)
        self.core = RouterCore(fleet, clock=clock, rng=rng)
        self.control = ControlSurface(self.core)
        self.router = AsyncRouter(self.core)
        self.upstream = Upstream(fleet)
        self.health = HealthMonitor(
            self.core, fleet.router.health, self.upstream.probe, generate=self.upstream.generate
        )
        self.engine_metrics = EngineMetricsPoller(self.core)
        self.metrics = RouterMetrics(
            self.core,
            lambda: self.health.ejections_total,
            lambda: self.engine_metrics.rejected,
        )
        self.served_models = ServedModels(self.core)
        self.proxy = Proxy(
            self.router, self.upstream, self.health, self.metrics, models=self.served_models
        )
        self.front = FrontDoor(self.proxy, self.core, self.metrics)
        self.rollouts = RolloutManager(self.core, self.control, learn=self.served_models.learn)
        """Model rollouts (router/rollout/), steered through the admin API."""
        self.admin = AdminApi(
            self.core,
            self.control,
            self.health,
            token=admin_token,
            telemetry=telemetry,
            engine_metrics=self.engine_metrics.status,
            served_models=self.served_models.status,
            private=admin_socket is not None,
            rollouts=self.rollouts,
        )
        self.admin_app: Callable[[Scope, Receive, Send], Awaitable[None]] = self.admin
        """What the admin listener serves: the admin API, or a worker's private API around
        it (router/workers/private_api.py)."""
        self._fitter = ProcessFitter()
        self._servers: list[EmbeddedUvicorn] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._addresses: list[str] = []
        self._stopped: asyncio.Event | None = None

    def route_commands(self, apply: Apply) -> None:
        """Give every command given to this router through ``apply`` from now on: the admin
        API's, and its rollouts' and splits' drains, undrains and splits (``gpurouter serve``
        passes its control link's, which publishes them as the cluster's desired state)."""
        self.admin.apply = apply
        self.rollouts.path.apply = apply

    @staticmethod
    def check_admin_address(fleet: FleetConfig, address: str | None, token: str | None) -> None:
        """ConfigError when the admin API would listen beyond loopback without a token."""
        address = address or fleet.server.admin_listen
        host, _ = split_host_port(address)
        if token is None and not is_loopback(host):
            source = str(fleet.source or "fleet")
            message = (
                f"the admin API would listen on {address}, which is not loopback, "
                "without a token; set server.admin_token_env (or listen on 127.0.0.1)"
            )
            raise ConfigError([Problem(source, None, "server.admin_listen", message)])

    @property
    def front_url(self) -> str:
        return self._url(0)

    @property
    def admin_url(self) -> str:
        return self._url(1)

    def _url(self, i: int) -> str:
        if not self._addresses:
            raise RuntimeError("the router server is not started")
        return self._addresses[i]

    async def start(self) -> None:
        """Bind both listeners, start the pool, the timers and health checks."""
        front = self._front_socket or bind_listener(self.listen, "front door", "server.listen")
        try:
            admin = self._admin_socket or bind_listener(
                self.admin_listen, "admin API", "server.admin_listen"
            )
        except OSError:
            front.close()
            raise
        sockets = [front, admin]
        try:
            await self.upstream.start()
            # Off the event loop: a run of the performance model takes a tenth of a second.
            self.core.capacity.fitter = self._fitter
            self.router.start()
            self.health.start()
            await self.engine_metrics.start()
            # Before the front door opens: requests go where their model is served.
            await self.served_models.start()
            apps: tuple[Callable[[Scope, Receive, Send], Awaitable[None]], ...] = (
                self.front,
                self.admin_app,
            )
            limits = ConnectionLimits.from_config(self.fleet.server, self.upstream.limit)
            routes = (CONNECTION_ROUTE, ADMIN_CONNECTION_ROUTE)
            for app, sock, route in zip(apps, sockets, routes, strict=True):
                refused = functools.partial(self.metrics.responses.refused, route)
                config = uvicorn_config(app, self.fleet.server.client_keepalive_s, limits, refused)
                server = EmbeddedUvicorn(config)
                self._servers.append(server)
                self._tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
                await server.wait_started(self._tasks[-1])
                self._addresses.append(_address(sock))
        except BaseException:
            for sock in sockets:
                sock.close()
            await self.stop(0)
            raise
        self._stopped = asyncio.Event()

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting; let in-flight requests finish within ``grace_s``; close the rest."""
        grace = self.fleet.server.shutdown_grace_s if grace_s is None else grace_s
        self.admin.close_streams()
        for server in self._servers:
            server.exit(grace)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # Handlers the grace cut short unwind now (their request ends in the core).
        pending = list(self.proxy.active)
        if pending:
            await asyncio.wait(pending, timeout=_HANDLER_WAIT_S)
        self._servers.clear()
        self._tasks.clear()
        await self.rollouts.close()
        await self.engine_metrics.stop()
        await self.served_models.stop()
        await self.health.stop()
        await self.router.stop()
        self._fitter.close()
        await self.upstream.close()
        if self._stopped is not None:
            self._stopped.set()

    async def serve_forever(self, started: Callable[[], Awaitable[None]] | None = None) -> None:
        """Serve until SIGTERM or SIGINT, then stop gracefully (for ``gpurouter serve``).

        The signals are caught from the start: one that comes while the server (or
        ``started``, what the caller runs once it listens) is still starting stops it as
        soon as it has started, instead of killing the process mid-start."""
        loop = asyncio.get_running_loop()
        signalled = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signalled.set)
        try:
            if not self._servers:
                await self.start()
            try:
                if started is not None:
                    await started()
                await signalled.wait()
            finally:
                await self.stop()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


# ---- uvicorn inside someone else's loop --------------------------------------------------


class EmbeddedUvicorn(uvicorn.Server):
    """uvicorn that leaves signals to its host and waits for an event instead of polling."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()
        self._ready = asyncio.Event()
        self._grace_s = 0.0

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the host (serve_forever, or the console's app) owns signals

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self._ready.set()

    async def main_loop(self) -> None:
        await self._exit.wait()

    async def wait_started(self, task: asyncio.Task[None]) -> None:
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            task.result()  # raises what stopped it
            raise RuntimeError("uvicorn stopped before it started")

    def exit(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self.should_exit = True
        self._exit.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's graceful shutdown, without its fixed sleeps and with a float grace."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        # Idle keep-alive connections close now; busy ones close after their response.
        for connection in list(self.server_state.connections):
            connection.shutdown()
        tasks = set(self.server_state.tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._grace_s)
            for connection in list(self.server_state.connections):
                if isinstance(connection, GuardedProtocol):
                    connection.abandon(_SHUTTING_DOWN)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=_HANDLER_WAIT_S)
        for connection in list(self.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.close()
        for server in self.servers:
            await server.wait_closed()


def uvicorn_config(
    app: Callable[[Scope, Receive, Send], Awaitable[None]],
    keepalive_s: int,
    limits: ConnectionLimits,
    refused: Refused,
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        # uvicorn's own default (5 s) is shorter than aiohttp's client pool keeps an idle
        # connection (15 s): a request sent as the server closed it got no answer at all.
        timeout_keep_alive=keepalive_s,
        http=guarded_protocol(limits, refused),
        ws="none",
        lifespan="off",
        loop="none",
        access_log=False,
        log_config=None,
        log_level="warning",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        backlog=2048,
    )


def split_host_port(text: str) -> tuple[str, int]:
    """``"127.0.0.1:8000"`` or ``"[::1]:0"`` -> (host, port); ValueError if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ListenError(OSError):
    """A listener could not take its address: which listener, the address, the setting that
    moves it, and the system's reason (``errno`` as the OSError it wraps)."""

    def __init__(self, listener: str, address: str, setting: str, cause: OSError) -> None:
        # socket.create_server's own text repeats the address as a Python tuple.
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        super().__init__(cause.errno, reason)
        self.listener = listener
        self.address = address
        self.setting = setting

    def __str__(self) -> str:
        return f"the {self.listener} cannot listen on {self.address}: {self.strerror}"


def bind_listener(address: str, listener: str, setting: str) -> socket.socket:
    host, port = split_host_port(address)
    if host == "localhost":
        host = "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise ListenError(listener, address, setting, exc) from None


def _address(sock: socket.socket) -> str:
    if sock.family == getattr(socket, "AF_UNIX", None):
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
