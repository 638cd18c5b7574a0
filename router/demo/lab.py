"""The demo's lab: what stands in for a real fleet and its clients, on one event loop.

:class:`Lab` starts the emulated replicas on their endpoints' loopback ports (with the
emulator's fault API on a free one), one node agent per node publishing the emulated GPUs
over MQTT, and, once the router's front door is known, the open-loop load generator. It
runs in a process of its own (:mod:`router.demo.lab_child`), so the console's process holds
only what a production console holds; ``DemoOptions(lab_in_process=True)`` runs it on the
console's loop instead, kept for the benchmark that compares the two, not for use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

from router.config.schema import FleetConfig
from router.demo.channel import ClientTally, LabPlan, LabReady, RateStep
from router.demo.load import conv_mix, demo_capacity_rps, swing_phases, swinging_shots
from router.loadgen import LoadGenerator, ShotResult
from router.telemetry.connection import cancel_and_wait

if TYPE_CHECKING:
    from router.emulator import EmulatedFleet
    from router.telemetry.agent import NodeAgent

__all__ = ["Lab"]

_LOAD_DRAIN_S = 1.0
"""At stop, how long answers still coming are waited for before they are cut off."""
_LOAD_STOP_S = 2.0
_AGENT_STOP_S = 1.5
_MAX_REQUESTS = 10_000_000
_MAX_DURATION_S = 7 * 24 * 3600.0
"""Bounds on an open-ended demo's load (it stops long before, when the operator says so)."""


class Lab:
    """Emulated fleet, node agents and load, started and stopped together."""

    def __init__(self, fleet: FleetConfig, plan: LabPlan) -> None:
        self.fleet = fleet
        self.plan = plan
        self.emulated: EmulatedFleet | None = None
        self.agents: list[NodeAgent] = []
        self._agent_tasks: list[asyncio.Task[None]] = []
        self._mix = conv_mix()
        self._ready: LabReady | None = None
        self._generator: LoadGenerator | None = None
        self._load_task: asyncio.Task[Any] | None = None
        self._load_stopping = False
        self._client: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()

    async def start(self) -> LabReady:
        """Serve the replicas and start the agents; on failure, stop what started and raise
        (OSError for a port that cannot be taken, GpuRouterError for the rest)."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> LabReady:
        from router.emulator import EmulatedFleet

        # The capacity measurement runs the simulator for a second or two: off the loop.
        capacity = asyncio.create_task(asyncio.to_thread(demo_capacity_rps, self.fleet, self._mix))
        try:
            self.emulated = EmulatedFleet(
                self.fleet, time_scale=self.plan.time_scale, seed=self.plan.seed
            )
            await self.emulated.start()
            control = await self.emulated.start_control()
            self._start_agents(self.emulated)
            capacity_rps = await capacity
        finally:
            if not capacity.done():
                capacity.cancel()
            # On a failed start, collect the measurement's own error too (it is not the cause).
            await asyncio.gather(capacity, return_exceptions=True)
        phases = swing_phases(self.plan.load, capacity_rps, self._mix, self.plan.time_scale)
        self._ready = LabReady(
            capacity_rps,
            tuple(RateStep(p.duration_s, p.rate_rps) for p in phases),
            len(self.agents),
            f"http://127.0.0.1:{control}",
        )
        return self._ready

    def _start_agents(self, emulated: EmulatedFleet) -> None:
        from router.telemetry.agent import EmulatedSource, NodeAgent, node_replicas
        from router.telemetry.connection import resolve_target

        target = resolve_target(self.fleet.broker, url=self.plan.broker_url)
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

    # ---- the load ---------------------------------------------------------------------------

    def start_load(self, front_url: str, start_at: float) -> None:
        """Send the swinging load to ``front_url``, its schedule's time 0 at ``start_at``."""
        if self._ready is None or self._load_task is not None:
            raise RuntimeError("the load starts once, after the lab has started")
        scale = self.plan.time_scale
        phases = swing_phases(self.plan.load, self._ready.capacity_rps, self._mix, scale)
        model = self.fleet.model or self.fleet.replicas[0].model
        self._generator = LoadGenerator(
            front_url, model, max_in_flight=self.plan.max_in_flight, stream=True
        )
        shots = swinging_shots(phases, self.plan.seed, lambda: self._load_stopping)
        self._load_task = asyncio.create_task(
            self._generator.run(
                shots,
                max_requests=_MAX_REQUESTS,
                max_duration_s=_MAX_DURATION_S,
                drain_s=_LOAD_DRAIN_S,
                time_scale=scale,
                on_result=self._on_result,
                start_at=start_at,
            ),
            name="demo-load",
        )

    def _on_result(self, result: ShotResult) -> None:
        self._client[result.outcome] += 1
        if result.error is not None:
            self._errors[result.error] += 1

    def tally(self) -> ClientTally:
        in_flight = 0 if self._generator is None else self._generator.in_flight
        return ClientTally(dict(self._client), dict(self._errors), in_flight)

    async def stop_load(self) -> ClientTally:
        """End the schedule; answers still coming get a short drain. The final tally."""
        task, self._load_task = self._load_task, None
        if task is not None:
            self._load_stopping = True  # the schedule ends at its next shot
            done, _ = await asyncio.wait({task}, timeout=_LOAD_STOP_S)
            if not done:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return self.tally()

    # ---- stop ---------------------------------------------------------------------------------

    async def stop(self) -> None:
        """The load, the agents (they publish ``offline``), then the replicas. Idempotent."""
        await self.stop_load()
        await self._stop_agents()
        emulated, self.emulated = self.emulated, None
        if emulated is not None:
            await emulated.stop()

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
