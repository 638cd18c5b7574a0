"""The demo, UI-free: every part of gpurouter started together on one event loop.

:class:`Demo` brings up, in this order, the MQTT broker (the embedded amqtt in a child
process, or the fleet file's broker), the emulated replicas on their endpoints' loopback
ports, one node agent per node publishing the emulated GPUs over MQTT, the router (front
door, admin API, telemetry subscriber), and an open-loop load generator sending real HTTP to
the front door at a swinging, bursty rate. :meth:`Demo.stop` takes them down in the reverse
order, each with a time limit, so that nothing (no process, no port) is left behind.

The router starts on round-robin whatever the fleet file says: on a mixed fleet the imbalance
shows at once, and switching strategy shows the gain within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from router.config.schema import FleetConfig, StrategyConfig
from router.control import Event
from router.demo.load import (
    DemoLoad,
    conv_mix,
    demo_capacity_rps,
    offered_rps,
    swing_phases,
    swinging_shots,
)
from router.demo.report import RunTally, StrategySwitch, snapshot_line
from router.emulator.fleet import loopback_address
from router.errors import GpuRouterError
from router.loadgen import LoadGenerator, RatePhase, ShotResult
from router.telemetry.connection import cancel_and_wait
from router.telemetry.status import DISABLED, TelemetryStatus

if TYPE_CHECKING:
    from router.emulator import EmulatedFleet
    from router.http.server import RouterServer
    from router.telemetry.agent import NodeAgent
    from router.telemetry.embedded_broker import EmbeddedBroker
    from router.telemetry.subscriber import TelemetrySubscriber

__all__ = ["Demo", "DemoOptions", "check_ports_free"]

START_STRATEGY = "round-robin"
_LOAD_DRAIN_S = 1.0
"""At stop, how long answers still coming are waited for before they are cut off."""
_LOAD_STOP_S = 2.0
_ROUTER_GRACE_S = 0.5
_AGENT_STOP_S = 1.5
_MAX_REQUESTS = 10_000_000
_MAX_DURATION_S = 7 * 24 * 3600.0
"""Bounds on an open-ended demo's load (it stops long before, when the operator says so)."""


@dataclass(frozen=True, slots=True)
class DemoOptions:
    time_scale: float = 1.0
    """The emulator runs this many times faster than life (the load follows)."""
    listen: str | None = None
    """The front door's HOST:PORT (default: the fleet file's server.listen)."""
    admin_listen: str | None = None
    """The admin API's HOST:PORT (default: the fleet file's server.admin_listen)."""
    load: DemoLoad = field(default_factory=DemoLoad)
    seed: int = 0
    max_in_flight: int = 2048
    """The load generator's cap on requests in flight (more are counted not_sent)."""


class Demo:
    """Broker, emulated fleet, node agents, router and load, started and stopped together."""

    def __init__(self, fleet: FleetConfig, options: DemoOptions | None = None) -> None:
        self.options = options or DemoOptions()
        if self.options.time_scale <= 0:
            raise GpuRouterError(f"the time scale must be > 0, got {self.options.time_scale}")
        router = dataclasses.replace(fleet.router, strategy=StrategyConfig(START_STRATEGY))
        self.fleet = dataclasses.replace(fleet, router=router)
        self.broker: EmbeddedBroker | None = None
        self.broker_url: str | None = None
        self.emulated: EmulatedFleet | None = None
        self.agents: list[NodeAgent] = []
        self._agent_tasks: list[asyncio.Task[None]] = []
        self.server: RouterServer | None = None
        self.subscriber: TelemetrySubscriber | None = None
        self.capacity_rps = 0.0
        """The fleet's physical limit on the demo's mix, requests per emulated second."""
        self.client: Counter[str] = Counter()
        """How the load generator's requests ended so far."""
        self.client_errors: Counter[str] = Counter()
        """What each request without an HTTP answer died of."""
        self.tally = RunTally()
        self._phases: list[RatePhase] = []
        self._load_task: asyncio.Task[Any] | None = None
        self._load_stopping = False
        self._unsubscribe: Callable[[], None] | None = None
        self._t0 = time.monotonic()
        self._stopped = False
        self._outcomes_at_stop: dict[str, int] | None = None

    # ---- what the front ends read ---------------------------------------------------------

    @property
    def started_at(self) -> float:
        """The monotonic time the demo started."""
        return self._t0

    @property
    def front_url(self) -> str:
        return self._server().front_url

    @property
    def admin_url(self) -> str:
        return self._server().admin_url

    def telemetry(self) -> TelemetryStatus:
        return DISABLED if self.subscriber is None else self.subscriber.status()

    def offered_rps(self) -> float:
        """The load's scheduled rate now, in requests per wall-clock second."""
        if not self._phases:
            return 0.0
        scale = self.options.time_scale
        return offered_rps(self._phases, (time.monotonic() - self._t0) * scale) * scale

    def snapshot_line(self) -> dict[str, Any]:
        """The per-second JSON object; it is also added to the run's tally."""
        snap = self._server().core.snapshot()
        line = snapshot_line(
            time.monotonic() - self._t0,
            snap,
            self.telemetry(),
            offered_rps=self.offered_rps(),
            client=self.client,
        )
        self.tally.add(line)
        return line

    def summary(self) -> dict[str, Any]:
        outcomes = {} if self.server is None else dict(self.server.core.snapshot().outcomes)
        return self.tally.summary(
            time.monotonic() - self._t0,
            outcomes,
            self.client,
            self.client_errors,
            at_stop=self._outcomes_at_stop,
        )

    def _server(self) -> RouterServer:
        if self.server is None:
            raise RuntimeError("the demo is not started")
        return self.server

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything; on any failure, stop what started and raise (OSError for a
        taken port, GpuRouterError for the rest)."""
        check_ports_free(self.fleet)
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        from router.emulator import EmulatedFleet
        from router.http.server import RouterServer

        mix = conv_mix()
        # The capacity measurement runs the simulator for a second or two: off the loop.
        capacity = asyncio.create_task(asyncio.to_thread(demo_capacity_rps, self.fleet, mix))
        try:
            self.broker_url = await self._start_broker()
            self.emulated = EmulatedFleet(
                self.fleet, time_scale=self.options.time_scale, seed=self.options.seed
            )
            await self.emulated.start()
            self._start_agents(self.emulated, self.broker_url)
            self.server = RouterServer(
                self.fleet,
                listen=self.options.listen,
                admin_listen=self.options.admin_listen,
                telemetry=self.telemetry,
            )
            await self.server.start()
            self._unsubscribe = self.server.control.subscribe(self._on_event)
            await self._start_subscriber(self.server, self.broker_url)
            self.capacity_rps = await capacity
        finally:
            if not capacity.done():
                capacity.cancel()
            # On a failed start, collect the measurement's own error too (it is not the cause).
            await asyncio.gather(capacity, return_exceptions=True)
        self._start_load(self.server.front_url, mix)
        self._t0 = time.monotonic()

    async def _start_broker(self) -> str:
        from router.telemetry.embedded_broker import EmbeddedBroker

        if self.fleet.broker.url != "embedded":
            return self.fleet.broker.url
        self.broker = EmbeddedBroker()
        return await self.broker.start()

    def _start_agents(self, emulated: EmulatedFleet, broker_url: str) -> None:
        from router.telemetry.agent import EmulatedSource, NodeAgent, node_replicas
        from router.telemetry.connection import resolve_target

        target = resolve_target(self.fleet.broker, url=broker_url)
        period = self.fleet.broker.sample_period_s
        for node in self.fleet.nodes:
            replica_map, models = node_replicas(self.fleet, node.name)
            agent = NodeAgent(
                node.name,
                EmulatedSource(emulated, period_s=period),
                target=target,
                cluster=self.fleet.cluster,
                replica_map=replica_map,
                models=models,
            )
            self.agents.append(agent)
            self._agent_tasks.append(asyncio.create_task(agent.run(), name=f"agent-{node.name}"))

    async def _start_subscriber(self, server: RouterServer, broker_url: str) -> None:
        from router.telemetry.subscriber import TelemetrySubscriber

        self.subscriber = TelemetrySubscriber(self.fleet, server.core, broker=broker_url)
        await self.subscriber.start()

    def _start_load(self, front_url: str, mix: Any) -> None:
        scale = self.options.time_scale
        self._phases = swing_phases(self.options.load, self.capacity_rps, mix, scale)
        model = self.fleet.model or self.fleet.replicas[0].model
        generator = LoadGenerator(
            front_url, model, max_in_flight=self.options.max_in_flight, stream=True
        )
        shots = swinging_shots(self._phases, self.options.seed, lambda: self._load_stopping)
        self._load_task = asyncio.create_task(
            generator.run(
                shots,
                max_requests=_MAX_REQUESTS,
                max_duration_s=_MAX_DURATION_S,
                drain_s=_LOAD_DRAIN_S,
                time_scale=scale,
                on_result=self._on_result,
            ),
            name="demo-load",
        )

    def _on_result(self, result: ShotResult) -> None:
        self.client[result.outcome] += 1
        if result.error is not None:
            self.client_errors[result.error] += 1

    def _on_event(self, event: Event) -> None:
        if event.kind == "strategy" and event.ok:
            switch = StrategySwitch(
                time.monotonic() - self._t0, str(event.args.get("name")), event.actor
            )
            self.tally.switches.append(switch)

    async def stop(self) -> None:
        """Stop everything, newest first, each part within its own time limit. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            # From here on, what ends otherwise than completed ends because of the stop.
            self._outcomes_at_stop = dict(self.server.core.snapshot().outcomes)
        await self._stop_load()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.subscriber is not None:
            await self.subscriber.stop()
        if self.server is not None:
            with contextlib.suppress(RuntimeError):  # never started: nothing to stop
                await self.server.stop(_ROUTER_GRACE_S)
        await self._stop_agents()
        if self.emulated is not None:
            await self.emulated.stop()
        if self.broker is not None:
            await self.broker.stop()

    async def _stop_load(self) -> None:
        task, self._load_task = self._load_task, None
        if task is None:
            return
        # The schedule ends at its next shot; answers still coming get a short drain.
        self._load_stopping = True
        done, _ = await asyncio.wait({task}, timeout=_LOAD_STOP_S)
        if not done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _stop_agents(self) -> None:
        for agent in self.agents:
            agent.stop()
        tasks, self._agent_tasks = self._agent_tasks, []
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=_AGENT_STOP_S)
        for task in pending:
            # An agent's failure at shutdown leaves nothing to clean up.
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        await asyncio.gather(*tasks, return_exceptions=True)  # retrieve how each ended


def check_ports_free(fleet: FleetConfig) -> None:
    """GpuRouterError naming the first emulated replica whose endpoint port is taken."""
    for replica in fleet.replicas:
        address = loopback_address(replica)
        if isinstance(address, str):
            continue  # EmulatedFleet reports endpoints off loopback, all at once
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise GpuRouterError(
                    f"port {port} of replica {replica.id} ({replica.endpoint}) is taken"
                    f" ({exc.strerror}); is another demo or emulator running?"
                ) from None
