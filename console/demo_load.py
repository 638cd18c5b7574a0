"""A router core kept busy on a virtual clock, with emulated GPU readings, for screenshots
and the console benchmark (no sockets, no GPUs).

Requests arrive at a fixed rate with mixed priorities; each replica serves a request in a
time that scales inversely with its static weight; GPU readings come from the replica
emulator's NVML model (``router.emulator.gpu``) at the router's in-flight share, as a node
agent would publish them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from console.backend import ConsoleBackend, GpuKey
from router.clock import ManualClock
from router.config.schema import FleetConfig
from router.control import ControlSurface
from router.core import Assignment, CoreListener, RouterCore
from router.emulator.gpu import GpuLoad, gpu_samples
from router.perf.profiles import default_catalog
from router.replica import Telemetry
from router.request import Priority, Request
from router.telemetry.schema import GpuSample
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus

GIB = 1 << 30


class _Starts(CoreListener):
    def __init__(self) -> None:
        self.started: list[Assignment] = []

    def on_assign(self, assignment: Assignment) -> None:
        self.started.append(assignment)


class FleetDriver:
    def __init__(
        self,
        fleet: FleetConfig,
        *,
        rate_rps: float,
        seed: int = 7,
        stale_nodes: frozenset[str] = frozenset(),
        wall: float = 1_700_000_000.0,
    ) -> None:
        self.fleet = fleet
        self.clock = ManualClock(10_000.0)
        self.rng = random.Random(seed)
        self.core = RouterCore(fleet, clock=self.clock, rng=random.Random(seed))
        self.control = ControlSurface(self.core, wall_clock=lambda: wall)
        self.rate_rps = rate_rps
        self.stale_nodes = stale_nodes
        self._starts = _Starts()
        self.core.listeners.append(self._starts)
        self._due: dict[str, float] = {}
        self._ttft: dict[str, float] = {}
        self._n = 0
        self._catalog = default_catalog()
        self._samples: dict[GpuKey, GpuSample] = {}
        self._read_at: dict[str, float] = {}

    def backend(self) -> ConsoleBackend:
        return ConsoleBackend(
            self.core, self.control, telemetry=self.status, gpu_samples=self.samples
        )

    def advance(self, seconds: float, step: float = 0.02) -> None:
        """Run arrivals, first bytes and completions for ``seconds`` of virtual time."""
        steps = round(seconds / step)
        for n in range(steps):
            if n == steps * 2 // 5:
                # Agents sample mid-period: a fresh reading is a fraction of a period old.
                self._read_gpus()
            self.clock.advance(step)
            now = self.clock()
            arrivals = self.rng.random() < (self.rate_rps * step) % 1
            for _ in range(int(self.rate_rps * step) + arrivals):
                self._n += 1
                prio = Priority(self.rng.choices((0, 1, 2), (1, 6, 3))[0])
                self.core.submit(
                    Request(f"req-{self._n}", self.rng.randint(100, 900), 128, now, prio)
                )
            for started in self._starts.started:
                speed = started.replica.config.weight
                rid = started.request.id
                self._due[rid] = now + self.rng.uniform(0.6, 1.4) * 2.0 / speed
                self._ttft[rid] = now + self.rng.uniform(0.5, 1.5) * 0.4 / speed
            self._starts.started.clear()
            for rid, due in list(self._due.items()):
                a = self.core.running.get(rid)
                if a is None:
                    del self._due[rid]
                    self._ttft.pop(rid, None)
                elif a.first_byte is None:
                    if self._ttft.get(rid, now) <= now:
                        self._ttft.pop(rid, None)
                        self.core.first_byte(a)
                elif due <= now:
                    del self._due[rid]
                    self.core.complete(a)
            self.core.expire()

    def _read_gpus(self) -> None:
        """One agent sample per node, stamped into the replicas as the subscriber does."""
        now = self.clock()
        for node in self.fleet.nodes:
            if node.name in self.stale_nodes and node.name in self._read_at:
                continue
            loads: dict[int, GpuLoad] = {}
            for rc in node.replicas:
                r = self.core.replica(rc.id)
                util = min(1.0, r.in_flight / max(1, r.batch_size) * self.rng.uniform(0.9, 1.0))
                used = (16 + 40 * util) * GIB / len(rc.gpus)
                for i in rc.gpus:
                    loads[i] = GpuLoad(rc.id, util, int(used))
                r.telemetry = Telemetry(util, now)
            for s in gpu_samples(node, loads, self._catalog):
                self._samples[(node.name, s.index)] = s
            self._read_at[node.name] = now

    def samples(self) -> Mapping[GpuKey, GpuSample]:
        return self._samples

    def status(self) -> TelemetryStatus:
        now = self.clock()
        period = self.fleet.broker.sample_period_s
        feeds = []
        for node in self.fleet.nodes:
            at = self._read_at.get(node.name)
            age = None if at is None else now - at
            feeds.append(
                NodeFeed(
                    node=node.name,
                    online=True,
                    age_s=age,
                    stale=age is None or age > 3 * period,
                    session=1,
                    restarts=0,
                    samples=int(now),
                    lost_samples=0,
                    dropped=0,
                    gpus=tuple(s for (n, _), s in self._samples.items() if n == node.name),
                )
            )
        return TelemetryStatus(BrokerState.CONNECTED, "mqtt://127.0.0.1:1883", tuple(feeds))
