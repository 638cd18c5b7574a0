"""Run a scenario live: the real router (RouterServer) in front of an emulated or real fleet,
driven by real HTTP from the load generator.

With ``emulated: true`` every replica of the fleet file is served by EmulatedFleet on a free
loopback port and the router is pointed at those; faults go to the emulator. With
``emulated: false`` the fleet's own endpoints are used and faults cannot be set.

Scenario time is emulated time: at ``time_scale`` k the emulator runs k times faster than
life, so the load generator sends k times faster, actions and samples come k times sooner,
and the router's own timers that pace a drill (queue deadline, health checks and ejection
windows, retry backoff, waits for a replica's answer, adaptive tuning) are shortened k
times too. A drill keeps its shape at any scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from router.config.schema import FleetConfig, RouterConfig
from router.control import ControlSurface
from router.errors import ConfigError, Problem
from router.loadgen import LoadGenerator
from router.scenario.recording import Recorder, sample_line
from router.scenario.report import (
    Emit,
    RunReport,
    action_line,
    apply_command,
    finish_run,
    note_action,
)
from router.scenario.schema import Action, Scenario
from router.scenario.workload import Workload

if TYPE_CHECKING:
    from router.emulator import EmulatedFleet
    from router.http.server import RouterServer
    from router.loadgen import Shot

__all__ = ["run_live", "run_live_blocking"]

_STOP_GRACE_S = 0.0
"""The run is over when the drain ends: whatever is left is cut off, not waited for."""


def check_live(scenario: Scenario) -> None:
    """ConfigError for what a live run cannot do: faults or a time scale on real endpoints."""
    if scenario.fleet.emulated:
        return
    source = str(scenario.source)
    problems = [
        Problem(source, a.line, f"actions[{i}].fault", "faults need an emulated fleet live")
        for i, a in enumerate(scenario.actions)
        if a.fault is not None
    ]
    if scenario.fleet.time_scale != 1.0:
        message = "real endpoints run in real time; time_scale needs an emulated fleet"
        problems.append(Problem(source, None, "fleet.time_scale", message))
    if problems:
        raise ConfigError(problems)


def run_live_blocking(scenario: Scenario, emit: Emit) -> RunReport:
    """``run_live`` on a fresh event loop (for the command line)."""
    return asyncio.run(run_live(scenario, emit))


async def run_live(scenario: Scenario, emit: Emit, *, listen: str = "127.0.0.1:0") -> RunReport:
    # Imported here: the HTTP stack is only needed live.
    from router.emulator import EmulatedFleet
    from router.http.server import RouterServer

    check_live(scenario)
    workload = Workload(scenario)
    shots = list(workload.shots())
    scale = scenario.fleet.time_scale
    config = scenario.fleet.config
    emulated: EmulatedFleet | None = None
    server: RouterServer | None = None
    try:
        if scenario.fleet.emulated:
            # Served on loopback whatever hosts the fleet file names (the ports are the OS's).
            loopback = {r.id: "http://127.0.0.1:1" for r in config.replicas}
            emulated = EmulatedFleet(
                _pointed_at(config, loopback),
                time_scale=scale,
                seed=scenario.seed,
                ports={r.id: 0 for r in config.replicas},
            )
            await emulated.start()
            config = _pointed_at(config, {rid: r.url for rid, r in emulated.replicas.items()})
        server = RouterServer(
            dataclasses.replace(config, router=_scaled(config.router, scale)),
            listen=listen,
            admin_listen="127.0.0.1:0",
        )
        await server.start()
        return await _drive(scenario, server, emulated, workload, shots, emit)
    finally:
        if server is not None:
            await server.stop(_STOP_GRACE_S)
        if emulated is not None:
            await emulated.stop()


async def _drive(
    scenario: Scenario,
    server: RouterServer,
    emulated: EmulatedFleet | None,
    workload: Workload,
    shots: list[Shot],
    emit: Emit,
) -> RunReport:
    scale = scenario.fleet.time_scale
    core = server.core
    control: ControlSurface = server.control
    if scenario.strategy is not None:
        core.set_strategy(scenario.strategy, dict(scenario.strategy_params or {}))
    t0 = time.monotonic()
    rec = Recorder(core, lambda c: (c - t0) * scale)

    def now() -> float:
        return (time.monotonic() - t0) * scale

    async def act(action: Action) -> None:
        if action.command is not None:
            record = apply_command(control, action, now(), rec)
        else:
            ok, message = await _fault(emulated, action)
            record = note_action(rec, action, now(), ok, message)
        emit(action_line(record))

    async def sample(t: float) -> None:
        emit(sample_line(rec.sample(t)))

    timed: list[tuple[float, Callable[[], Awaitable[None]]]] = [
        (a.at_s, partial(act, a)) for a in scenario.actions
    ]
    seconds = range(1, int(scenario.duration_s) + 1)
    timed += [(float(s), partial(sample, float(s))) for s in seconds]
    timed.sort(key=lambda item: item[0])
    timer = asyncio.create_task(_at_times(timed, t0, scale))
    model = config_model(scenario.fleet.config)
    # Streamed, so that the first byte is the first token (TTFT), as the simulator counts it.
    generator = LoadGenerator(server.front_url, model, max_in_flight=4096, stream=True)
    try:
        report = await generator.run(
            shots,
            max_requests=len(shots),
            max_duration_s=scenario.duration_s / scale,
            drain_s=scenario.drain_s / scale,
            time_scale=scale,
            on_drained=rec.finish,
        )
        await timer
    finally:
        timer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await timer
    lost = [r.shot.at_s for r in report.results if r.outcome == "error"]
    extra = {"client": dict(report.counts), "time_scale": scale}
    return finish_run(
        scenario, "live", rec, workload.capacity_at, lost, workload.known_capacity, extra
    )


async def _at_times(
    timed: list[tuple[float, Callable[[], Awaitable[None]]]], t0: float, scale: float
) -> None:
    for at, fn in timed:
        wait = t0 + at / scale - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await fn()


async def _fault(emulated: EmulatedFleet | None, action: Action) -> tuple[bool, str]:
    assert emulated is not None  # check_live refused faults on real endpoints
    replica = str(action.replica)
    match action.fault:
        case "kill":
            await emulated.kill(replica)
        case "revive" | "heal":
            await emulated.revive(replica)
        case "slow":
            await emulated.slow(replica, action.factor)
        case "fail_fraction":
            await emulated.fail_fraction(replica, action.fraction)
    return True, f"{replica}: {action.fault} set on the emulator"


def config_model(fleet: FleetConfig) -> str:
    """The model name requests ask for: the fleet's, else its first replica's."""
    return fleet.model or fleet.replicas[0].model


def _pointed_at(fleet: FleetConfig, urls: dict[str, str]) -> FleetConfig:
    """The fleet with each replica's endpoint replaced by where the emulator serves it."""
    nodes = tuple(
        dataclasses.replace(
            node,
            replicas=tuple(
                dataclasses.replace(r, endpoint=urls.get(r.id, r.endpoint)) for r in node.replicas
            ),
        )
        for node in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


def _scaled(router: RouterConfig, scale: float) -> RouterConfig:
    """The router's drill-pacing timers, ``scale`` times shorter."""
    if scale == 1.0:
        return router
    h, q, t, r, a = router.health, router.queue, router.timeouts, router.retries, router.adaptive
    return dataclasses.replace(
        router,
        queue=dataclasses.replace(q, default_deadline_s=q.default_deadline_s / scale),
        health=dataclasses.replace(
            h,
            check_interval_s=h.check_interval_s / scale,
            eject_base_s=h.eject_base_s / scale,
            eject_max_s=h.eject_max_s / scale,
        ),
        timeouts=dataclasses.replace(
            t, first_byte_s=t.first_byte_s / scale, total_s=t.total_s / scale
        ),
        retries=dataclasses.replace(
            r, backoff_s=r.backoff_s / scale, backoff_max_s=r.backoff_max_s / scale
        ),
        adaptive=dataclasses.replace(a, interval_s=a.interval_s / scale),
    )
