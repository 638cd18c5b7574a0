"""Run a scenario on the fleet simulator: the real router core on a virtual clock.

Actions and per-second samples are callbacks at their virtual times; control commands go
through the same ControlSurface the console and ``gpurouter ctl`` use; faults are the
simulator's models of what EmulatedFleet does to a live replica (those set for a version act
only while the replica serves it); a rollout step runs as router/scenario/sim_rollout.py and
a canary step as router/scenario/sim_canary.py. A minute of scenario takes well under a
second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from router.control import ControlSurface
from router.loadgen import Shot
from router.request import Priority, Request
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
from router.scenario.sim_canary import SimScenarioCanary
from router.scenario.sim_rollout import SimScenarioRollout
from router.scenario.workload import Workload
from router.sim.simulator import Simulation
from router.sim.workload import Arrival

__all__ = ["run_simulated"]


@dataclass(frozen=True, slots=True)
class _ShotArrival(Arrival):
    priority: Priority = Priority.NORMAL


class _ScenarioSimulation(Simulation):
    offered: dict[str, float]
    model: str | None
    """The model name every request asks for, as the live load generator's do; None: none
    (a canary step sets it: only requests for its stable name are split)."""

    def make_request(self, request_id: str, arrival: Arrival) -> Request:
        request = super().make_request(request_id, arrival)
        if isinstance(arrival, _ShotArrival):
            request.priority = arrival.priority
        request.model = self.model
        self.offered[request_id] = arrival.time
        return request


class _InterruptError(Exception):
    """The operator stopped the run; raised out of the simulation at a whole second."""

    def __init__(self, t: float) -> None:
        super().__init__(t)
        self.t = t


def run_simulated(
    scenario: Scenario, emit: Emit, stop: Callable[[], bool] | None = None
) -> RunReport:
    """Run the scenario on the simulator. ``stop`` is asked after each per-second sample:
    true ends the run there, with a partial report (``RunReport.interrupted_at``)."""
    workload = Workload(scenario)
    fleet = scenario.fleet.config
    strategy = scenario.strategy or fleet.router.strategy.name
    params = scenario.strategy_params if scenario.strategy else fleet.router.strategy.params
    sim = _ScenarioSimulation(fleet, strategy, seed=scenario.seed, strategy_params=params)
    sim.offered = {}
    stable = fleet.model or fleet.replicas[0].model
    sim.model = stable if any(a.canary is not None for a in scenario.actions) else None
    control = ControlSurface(sim.core, wall_clock=lambda: sim.clock.now)
    rec = Recorder(sim.core, lambda t: t)
    rollout = SimScenarioRollout(sim, control, stable)
    canary = SimScenarioCanary(sim, control)

    def act(action: Action) -> None:
        if action.command is not None:
            record = apply_command(control, action, sim.clock.now, rec)
        elif action.rollout is not None:
            ok, message = rollout.start(action.rollout)
            record = note_action(rec, action, sim.clock.now, ok, message)
        elif action.canary is not None:
            ok, message = canary.start(action.canary)
            record = note_action(rec, action, sim.clock.now, ok, message)
        else:
            ok, message = _fault(sim, action)
            record = note_action(rec, action, sim.clock.now, ok, message)
        emit(action_line(record))

    def sample(t: float) -> None:
        emit(sample_line(rec.sample(t)))
        if stop is not None and stop():
            raise _InterruptError(t)

    for action in scenario.actions:
        sim.at(action.at_s, partial(act, action))
    for second in range(1, int(scenario.duration_s) + 1):
        sim.at(float(second), partial(sample, float(second)))
    arrivals = (
        _ShotArrival(s.at_s, s.prompt_tokens, _output(s), s.max_tokens, s.priority)
        for s in workload.shots()
    )
    interrupted_at: float | None = None
    try:
        sim.run(arrivals, scenario.duration_s, drain_s=scenario.drain_s)
    except _InterruptError as interrupt:
        interrupted_at = interrupt.t
    lost = [t for rid, t in sim.offered.items() if rid not in rec.requests]
    rec.rollout = rollout.outcome()
    rec.canary = canary.outcome()
    extra: dict[str, object] = {}
    if rec.rollout is not None:
        end = scenario.duration_s + scenario.drain_s
        extra["rollout"] = rollout_summary(rec.rollout, rec, lost, end)
    if rec.canary is not None:
        extra["canary"] = rec.canary.to_dict()
    return finish_run(
        scenario,
        "simulate",
        rec,
        workload.capacity_at,
        lost,
        workload.known_capacity,
        extra,
        interrupted_at=interrupted_at,
    )


def _output(shot: Shot) -> int:
    """What the engine generates for a shot: its output length, or all it may."""
    return shot.max_tokens if shot.output_tokens is None else shot.output_tokens


def _fault(sim: Simulation, action: Action) -> tuple[bool, str]:
    replica = str(action.replica)
    match action.fault:
        case "kill":
            sim.kill(replica)
        case "revive" | "heal":
            sim.revive(replica)
        case "slow":
            sim.slow(replica, action.factor, action.version)
        case "fail_fraction":
            sim.fail_fraction(replica, action.fraction, action.version)
    of = "" if action.version is None else f" (while it serves {action.version})"
    return True, f"{replica}: {_DONE[str(action.fault)]}{of}"


_DONE = {
    "kill": "killed",
    "revive": "revived",
    "heal": "healed",
    "slow": "slowed",
    "fail_fraction": "failing a fraction of requests",
}
