"""Run a scenario live: the real router (RouterServer) in front of an emulated or real fleet,
driven by real HTTP from the load generator.

With ``emulated: true`` every replica of the fleet file is served by EmulatedFleet on a free
loopback port and the router is pointed at those; faults go to the emulator. With
``emulated: false`` the fleet's own endpoints are used and faults cannot be set. The emulator
and the load generator run in processes of their own (router.scenario.live_processes), so
that the router's loop carries the router alone.

Scenario time is emulated time: at ``time_scale`` k the emulator runs k times faster than
life, so the load generator sends k times faster, actions and samples come k times sooner,
and the router's own timers that pace a drill (queue deadline, health checks and ejection
windows, retry backoff, waits for a replica's answer, adaptive tuning) are shortened k
times too. A drill keeps its shape at any scale.

Whether the machine kept up is measured as the run goes (router.scenario.keeping_up); a run
where it did not judges none of its checks.
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
from router.scenario.keeping_up import LoopLag, keeping_up
from router.scenario.live_canary import LiveCanary
from router.scenario.live_processes import EmulatorProcess, LoadProcess, pointed_at
from router.scenario.live_rollout import LiveRollout
from router.scenario.recording import Recorder, sample_line
from router.scenario.report import (
    Emit,
    RunReport,
    action_line,
    apply_command,
    finish_run,
    note_action,
)
from router.scenario.rollout_report import rollout_summary
from router.scenario.schema import Action, Scenario
from router.scenario.workload import Workload

if TYPE_CHECKING:
    from router.http.server import RouterServer

__all__ = ["run_live", "run_live_blocking"]

_STOP_GRACE_S = 0.0
"""The run is over when the drain ends: whatever is left is cut off, not waited for."""
_START_MARGIN_S = 0.2
"""Time 0 is set this far ahead, so the load generator is waiting for it, not late to it."""


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


async def run_live(
    scenario: Scenario,
    emit: Emit,
    *,
    listen: str = "127.0.0.1:0",
    stop: asyncio.Event | None = None,
) -> RunReport:
    """Run the scenario live. ``stop`` set (the operator's Ctrl+C) ends it at once, with a
    partial report (``RunReport.interrupted_at``)."""
    # Imported here: the HTTP stack is only needed live.
    from router.http.server import RouterServer

    check_live(scenario)
    workload = Workload(scenario)
    shots = list(workload.shots())
    scale = scenario.fleet.time_scale
    config = scenario.fleet.config
    async with contextlib.AsyncExitStack() as stack:
        emulator: EmulatorProcess | None = None
        if scenario.fleet.emulated:
            emulator = EmulatorProcess(scenario.fleet.file, time_scale=scale, seed=scenario.seed)
            stack.push_async_callback(emulator.stop)
            config = pointed_at(config, await emulator.start())
        server = RouterServer(
            dataclasses.replace(config, router=_scaled(config.router, scale)),
            listen=listen,
            admin_listen="127.0.0.1:0",
        )
        stack.push_async_callback(server.stop, _STOP_GRACE_S)
        await server.start()
        load = LoadProcess(
            server.front_url,
            config_model(scenario.fleet.config),
            shots,
            max_duration_s=scenario.duration_s / scale,
            drain_s=scenario.drain_s / scale,
            time_scale=scale,
        )
        stack.push_async_callback(load.stop)
        await load.start()
        return await _drive(scenario, server, emulator, load, workload, emit, stop)
    raise AssertionError("unreachable: the block above returns or raises")


async def _drive(
    scenario: Scenario,
    server: RouterServer,
    emulator: EmulatorProcess | None,
    load: LoadProcess,
    workload: Workload,
    emit: Emit,
    stop: asyncio.Event | None = None,
) -> RunReport:
    scale = scenario.fleet.time_scale
    core = server.core
    control: ControlSurface = server.control
    if scenario.strategy is not None:
        core.set_strategy(scenario.strategy, dict(scenario.strategy_params or {}))
    t0 = time.monotonic() + _START_MARGIN_S
    rec = Recorder(core, lambda c: (c - t0) * scale)

    def now() -> float:
        return (time.monotonic() - t0) * scale

    rollout = _live_rollout(scenario, server, emulator, now)
    canary = _live_canary(scenario, server, emulator, now)

    async def act(action: Action) -> None:
        if action.command is not None:
            record = apply_command(control, action, now(), rec)
        elif action.rollout is not None:
            ok, message = rollout.start(action.rollout)
            record = note_action(rec, action, now(), ok, message)
        elif action.canary is not None:
            ok, message = canary.start(action.canary)
            record = note_action(rec, action, now(), ok, message)
        else:
            ok, message = await _fault(emulator, action)
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
    load.go(t0)
    if emulator is not None:
        emulator.measure()
    timer = asyncio.create_task(_at_times(timed, t0, scale))
    lag = LoopLag()
    ticker = asyncio.create_task(lag.run())
    try:
        interrupted_at = await _drained_or_stopped(load, stop, now)
        if interrupted_at is None:
            left = t0 + (scenario.duration_s + scenario.drain_s) / scale - time.monotonic()
            await asyncio.gather(rollout.settle(left), canary.settle(left))
        # The run ends here; what the cut-offs and the shutdown do is not part of it.
        rec.finish()
        ticker.cancel()
        rec.rollout = await rollout.outcome()
        rec.canary = await canary.outcome()
        if interrupted_at is not None:
            return finish_run(
                scenario, "live", rec, workload.capacity_at, [], workload.known_capacity,
                {"time_scale": scale}, interrupted_at=interrupted_at,
            )  # fmt: skip
        shares = {} if emulator is None else await emulator.clock_shares()
        load.cut_off()
        report = await load.report()
        await timer
    finally:
        for task in (timer, ticker):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    lost = [r.shot.at_s for r in report.results if r.outcome == "error"]
    extra: dict[str, object] = {"client": dict(report.counts), "time_scale": scale}
    if rec.rollout is not None:
        end = scenario.duration_s + scenario.drain_s
        extra["rollout"] = rollout_summary(rec.rollout, rec, lost, end)
    if rec.canary is not None:
        extra["canary"] = rec.canary.to_dict()
    kept = keeping_up(report.late_s, report.counts["not_sent"], lag, shares, scale, t0)
    return finish_run(
        scenario, "live", rec, workload.capacity_at, lost, workload.known_capacity, extra, kept
    )


def _live_rollout(
    scenario: Scenario,
    server: RouterServer,
    emulator: EmulatorProcess | None,
    now: Callable[[], float],
) -> LiveRollout:
    """The run's rollout step, started through the router's own rollout manager."""
    scale = scenario.fleet.time_scale
    urls = {r.id: r.config.endpoint for r in server.core.pool}
    control_url = "" if emulator is None else emulator.control_url
    stable = config_model(scenario.fleet.config)
    return LiveRollout(
        server.rollouts,
        now,
        urls,
        lambda step: step.live_settings(control_url, stable, scale),
        time_scale=scale,
    )


def _live_canary(
    scenario: Scenario,
    server: RouterServer,
    emulator: EmulatorProcess | None,
    now: Callable[[], float],
) -> LiveCanary:
    """The run's canary step, started through the router's own traffic splits."""
    scale = scenario.fleet.time_scale
    urls = {r.id: r.config.endpoint for r in server.core.pool}
    control_url = "" if emulator is None else emulator.control_url
    stable = config_model(scenario.fleet.config)
    base = scenario.fleet.config.rollout.canary
    return LiveCanary(
        server.rollouts.splits,
        now,
        urls,
        lambda step: step.live_body(control_url, stable, scale, base),
    )


async def _drained_or_stopped(
    load: LoadProcess, stop: asyncio.Event | None, now: Callable[[], float]
) -> float | None:
    """Until the load's drain ends (None) or the operator stops the run (the scenario time
    it stopped at)."""
    if stop is None:
        await load.drained()
        return None
    drained = asyncio.ensure_future(load.drained())
    stopped = asyncio.ensure_future(stop.wait())
    done, pending = await asyncio.wait({drained, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return None if drained in done else round(now(), 3)


async def _at_times(
    timed: list[tuple[float, Callable[[], Awaitable[None]]]], t0: float, scale: float
) -> None:
    for at, fn in timed:
        wait = t0 + at / scale - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await fn()


async def _fault(emulator: EmulatorProcess | None, action: Action) -> tuple[bool, str]:
    assert emulator is not None  # check_live refused faults on real endpoints
    replica = str(action.replica)
    match action.fault:
        case "kill" | "revive" | "heal":
            body: dict[str, object] = {"fault": action.fault}
        case "slow":
            body = {"fault": "slow", "factor": action.factor}
        case "fail_fraction":
            body = {"fault": "fail", "fraction": action.fraction}
        case _:
            return False, f"{replica}: unknown fault {action.fault!r}"
    if action.version is not None:
        body["version"] = action.version
    ok, answer = await emulator.fault(replica, body)
    return ok, (f"{replica}: {action.fault} set on the emulator" if ok else answer)


def config_model(fleet: FleetConfig) -> str:
    """The model name requests ask for: the fleet's, else its first replica's."""
    return fleet.model or fleet.replicas[0].model


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
            # A slower fleet's steps, silences and one-token probes last longer; a faster
            # one's do not shrink below what the router's own machine needs to answer.
            stream_idle_max_s=h.stream_idle_max_s / min(scale, 1.0),
            check_timeout_s=h.check_timeout_s / min(scale, 1.0),
        ),
        timeouts=dataclasses.replace(
            t, first_byte_s=t.first_byte_s / scale, total_s=t.total_s / scale
        ),
        retries=dataclasses.replace(
            r, backoff_s=r.backoff_s / scale, backoff_max_s=r.backoff_max_s / scale
        ),
        adaptive=dataclasses.replace(a, interval_s=a.interval_s / scale),
    )
