"""The demo, UI-free: every part of gpurouter started together.

:class:`Demo` brings up, in this order, the MQTT broker (the embedded amqtt in a child
process, or the fleet file's broker), the lab in a child process of its own
(:mod:`router.demo.lab`: the emulated replicas on their endpoints' loopback ports and one
node agent per node publishing the emulated GPUs over MQTT), the router in another child
(:mod:`router.demo.router_child`: front door, admin API with a bearer token made for the
run, telemetry subscriber), and then the lab's open-loop load generator, sending real HTTP
to the front door at a swinging, bursty rate. This process holds what a production console
holds: nothing of the router but its admin API's address and token (a front end attaches a
console to it, or reads its state for the headless lines). :meth:`Demo.stop` takes them
down in the reverse order, each with a time limit, so that nothing (no process, no port) is
left behind; a child process that ends on its own is reported through
:attr:`Demo.on_child_lost`.

The router starts on round-robin whatever the fleet file says: on a mixed fleet the imbalance
shows at once, and switching strategy shows the gain within seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from router.config.schema import FleetConfig, StrategyConfig
from router.control import Event
from router.demo.channel import ClientTally, LabPlan, LabReady, RouterPlan, RouterReady
from router.demo.load import DemoLoad, offered_rps
from router.demo.report import RunTally, StrategySwitch, snapshot_line
from router.emulator.fleet import loopback_address
from router.errors import GpuRouterError
from router.telemetry.status import DISABLED, TelemetryStatus

if TYPE_CHECKING:
    from router.demo.lab_process import LabProcess
    from router.demo.router_process import RouterProcess
    from router.http.server import RouterServer
    from router.snapshot import FleetSnapshot
    from router.telemetry.embedded_broker import EmbeddedBroker
    from router.telemetry.subscriber import TelemetrySubscriber

__all__ = ["Demo", "DemoOptions", "check_ports_free"]

START_STRATEGY = "round-robin"
_ROUTER_GRACE_S = 0.5


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
    lab_in_process: bool = False
    """Run the lab on this process's loop, as the demo did before it had a process of its
    own (the router then runs here too): kept for the benchmark that compares the layouts
    (bench/bench_demo_keys.py), not for use."""
    router_in_process: bool = False
    """Run the router on this process's loop, as the demo did before it had a process of
    its own: kept for the benchmark that compares the layouts, not for use."""

    @property
    def router_here(self) -> bool:
        """Whether the router runs in this process (an old layout, for the benchmark)."""
        return self.router_in_process or self.lab_in_process


class LabHandle(Protocol):
    """The lab as the demo drives it: :class:`~router.demo.lab.Lab` on this loop, or
    :class:`~router.demo.lab_process.LabProcess` in a child."""

    async def start(self) -> LabReady: ...

    def start_load(self, front_url: str, start_at: float) -> None: ...

    def tally(self) -> ClientTally: ...

    async def stop_load(self) -> ClientTally: ...

    async def stop(self) -> None: ...


class Demo:
    """Broker, lab (emulated fleet, node agents, load), and router, each in a process of
    its own, started and stopped together."""

    def __init__(self, fleet: FleetConfig, options: DemoOptions | None = None) -> None:
        self.options = options or DemoOptions()
        if self.options.time_scale <= 0:
            raise GpuRouterError(f"the time scale must be > 0, got {self.options.time_scale}")
        router = dataclasses.replace(fleet.router, strategy=StrategyConfig(START_STRATEGY))
        self.fleet = dataclasses.replace(fleet, router=router)
        self.broker: EmbeddedBroker | None = None
        self.broker_url: str | None = None
        self.lab: LabHandle | None = None
        self._lab_process: LabProcess | None = None
        self.ready: LabReady | None = None
        """What the lab said once started: capacity, load phases, agents, fault API."""
        self.server: RouterServer | None = None
        """The router, when it runs in this process (an old layout, for the benchmark)."""
        self.subscriber: TelemetrySubscriber | None = None
        self.router: RouterProcess | None = None
        """The router's child process (the layout the demo ships)."""
        self.router_ready: RouterReady | None = None
        self.tally = RunTally()
        self.on_child_lost: Callable[[], None] | None = None
        """Called if the lab's or the router's process ends while the demo runs
        (:attr:`child_lost` says why)."""
        self.child_lost: str | None = None
        self._final: ClientTally | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._t0 = time.monotonic()
        self._stopped = False
        self._outcomes_at_stop: dict[str, int] | None = None
        self._final_outcomes: dict[str, int] | None = None

    # ---- what the front ends read ---------------------------------------------------------

    @property
    def started_at(self) -> float:
        """The monotonic time the demo started."""
        return self._t0

    @property
    def started(self) -> bool:
        """The router has started (its addresses are known)."""
        return self.server is not None or self.router_ready is not None

    @property
    def front_url(self) -> str:
        if self.router_ready is not None:
            return self.router_ready.front_url
        return self._server().front_url

    @property
    def admin_url(self) -> str:
        if self.router_ready is not None:
            return self.router_ready.admin_url
        return self._server().admin_url

    @property
    def admin_token(self) -> str | None:
        """The admin API's bearer token (None for a router in this process without one)."""
        return None if self.router is None else self.router.token

    @property
    def router_pid(self) -> int | None:
        """The router's process, once started (None when it runs in this process)."""
        return None if self.router is None else self.router.pid

    @property
    def capacity_rps(self) -> float:
        """The fleet's physical limit on the demo's mix, requests per emulated second."""
        return 0.0 if self.ready is None else self.ready.capacity_rps

    @property
    def lab_pid(self) -> int | None:
        """The lab's process, once started (None when it runs in this process)."""
        return None if self._lab_process is None else self._lab_process.pid

    @property
    def agent_count(self) -> int:
        return 0 if self.ready is None else self.ready.agents

    @property
    def fault_url(self) -> str | None:
        """The emulator's fault API (docs/emulator.md), once the lab has started."""
        return None if self.ready is None else self.ready.control_url

    def client_tally(self) -> ClientTally:
        """How the load generator's requests ended so far (final once the demo stopped)."""
        if self._final is not None:
            return self._final
        return ClientTally() if self.lab is None else self.lab.tally()

    @property
    def client(self) -> Counter[str]:
        """How the load generator's requests ended so far."""
        return Counter(self.client_tally().client)

    @property
    def client_errors(self) -> Counter[str]:
        """What each request without an HTTP answer died of."""
        return Counter(self.client_tally().errors)

    def telemetry(self) -> TelemetryStatus:
        return DISABLED if self.subscriber is None else self.subscriber.status()

    def offered_rps(self) -> float:
        """The load's scheduled rate now, in requests per wall-clock second."""
        if self.ready is None or not self.ready.phases:
            return 0.0
        scale = self.options.time_scale
        return offered_rps(self.ready.phases, (time.monotonic() - self._t0) * scale) * scale

    def snapshot_line(
        self, snap: FleetSnapshot | None = None, status: TelemetryStatus | None = None
    ) -> dict[str, Any]:
        """The per-second JSON object, from the router's state as its admin API gave it
        (``snap``, ``status``), or the router in this process; added to the run's tally."""
        if snap is None:
            snap, status = self._server().core.snapshot(), self.telemetry()
        line = snapshot_line(
            time.monotonic() - self._t0,
            snap,
            DISABLED if status is None else status,
            offered_rps=self.offered_rps(),
            client=self.client,
        )
        self.tally.add(line)
        return line

    def summary(self) -> dict[str, Any]:
        if self.server is not None:
            outcomes = dict(self.server.core.snapshot().outcomes)
        else:
            outcomes = dict(self._final_outcomes or self._outcomes_at_stop or {})
        return self.tally.summary(
            time.monotonic() - self._t0,
            outcomes,
            self.client,
            self.client_errors,
            at_stop=self._outcomes_at_stop,
        )

    async def _router_outcomes(self) -> dict[str, int] | None:
        if self.server is not None:
            return dict(self.server.core.snapshot().outcomes)
        if self.router is not None and self.router_ready is not None:
            return await self.router.outcomes(self.router_ready.admin_url)
        return None

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
        self.broker_url = await self._start_broker()
        self.lab = self._lab(self.broker_url)
        self.ready = await self.lab.start()
        if self.options.router_here:
            await self._start_router_here(self.broker_url)
        else:
            await self._start_router_child(self.broker_url)
        self._t0 = time.monotonic()
        self.lab.start_load(self.front_url, self._t0)

    async def _start_router_child(self, broker_url: str) -> None:
        from router.demo.router_process import RouterProcess, new_token
        from router.http.admin import admin_token

        plan = RouterPlan(
            fleet_file=self._fleet_file(),
            broker_url=broker_url,
            strategy=START_STRATEGY,
            listen=self.options.listen,
            admin_listen=self.options.admin_listen,
            # The fleet's own token when it names one (the operator's), else one for this run.
            admin_token=admin_token(self.fleet) or new_token(),
        )
        self.router = RouterProcess(plan, on_lost=self._lost)
        self.router_ready = await self.router.start()

    async def _start_router_here(self, broker_url: str) -> None:
        from router.http.server import RouterServer

        self.server = RouterServer(
            self.fleet,
            listen=self.options.listen,
            admin_listen=self.options.admin_listen,
            telemetry=self.telemetry,
        )
        await self.server.start()
        self._unsubscribe = self.server.control.subscribe(self.record_event)
        await self._start_subscriber(self.server, broker_url)

    def _fleet_file(self) -> str:
        source = self.fleet.source
        if source is None:
            raise GpuRouterError("the demo's children read the fleet from its file; give one")
        return str(source)

    async def _start_broker(self) -> str:
        from router.telemetry.embedded_broker import EmbeddedBroker

        if self.fleet.broker.url != "embedded":
            return self.fleet.broker.url
        self.broker = EmbeddedBroker()
        return await self.broker.start()

    def _lab(self, broker_url: str) -> LabHandle:
        in_process = self.options.lab_in_process
        plan = LabPlan(
            fleet_file="" if in_process else self._fleet_file(),
            broker_url=broker_url,
            time_scale=self.options.time_scale,
            seed=self.options.seed,
            load=self.options.load,
            max_in_flight=self.options.max_in_flight,
        )
        if in_process:
            from router.demo.lab import Lab

            return Lab(self.fleet, plan)
        from router.demo.lab_process import LabProcess

        self._lab_process = LabProcess(plan, on_lost=self._lost)
        return self._lab_process

    def _lost(self, reason: str) -> None:
        self.child_lost = reason
        if self.on_child_lost is not None:
            self.on_child_lost()

    async def _start_subscriber(self, server: RouterServer, broker_url: str) -> None:
        from router.telemetry.subscriber import TelemetrySubscriber

        self.subscriber = TelemetrySubscriber(self.fleet, server.core, broker=broker_url)
        await self.subscriber.start()

    def record_event(self, event: Event) -> None:
        """An audit event of the router: a strategy switch goes into the run's tally (a
        front end attached to the router's child passes them on from its event stream)."""
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
        # From here on, what ends otherwise than completed ends because of the stop.
        self._outcomes_at_stop = await self._router_outcomes()
        if self.lab is not None:
            self._final = await self.lab.stop_load()
        if self.router is not None:
            self._final_outcomes = await self._router_outcomes()
            await self.router.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self.subscriber is not None:
            await self.subscriber.stop()
        if self.server is not None:
            with contextlib.suppress(RuntimeError):  # never started: nothing to stop
                await self.server.stop(_ROUTER_GRACE_S)
        if self.lab is not None:
            await self.lab.stop()
        if self.broker is not None:
            await self.broker.stop()


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
