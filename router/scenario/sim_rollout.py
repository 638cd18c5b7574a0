"""A scenario's rollout step on the simulator (``gpurouter run --simulate``).

The step's settings are read as live (the fleet file's ``rollout:`` section under the step's
own keys) and run by router/rollout/simulated.py on the simulated router. The load time is
the emulator updater's ``load_s`` (its default when the step names none), else the settings'
``load_estimate_s``. The outcome is the same record a live run keeps, with what each
simulated replica would list on ``/v1/models``, so the same checks read it.
"""

from __future__ import annotations

from typing import Any, cast

from router.config.loader import parse_rollout_settings
from router.config.schema import FleetConfig
from router.control import ControlSurface
from router.errors import ConfigError, RolloutError
from router.rollout.plan import Order
from router.rollout.simulated import SimRolloutSpec, SimulatedRollout
from router.scenario.recording import RolloutOutcome
from router.scenario.rollout_step import RolloutStep
from router.sim.simulator import Simulation

__all__ = ["SimScenarioRollout", "sim_spec"]

ACTOR = "scenario"


def sim_spec(step: RolloutStep, fleet: FleetConfig, stable_name: str) -> SimRolloutSpec:
    """The simulated rollout a step describes; ConfigError for a setting the loader let by
    (it checks every step against the fleet file already)."""
    own: dict[str, Any] = {k: v for k, v in step.settings.items() if k != "order"}
    raw_order = step.settings.get("order")
    if isinstance(raw_order, str):
        own["order"] = raw_order
    config = parse_rollout_settings(own, fleet.rollout)
    order = cast(Order, tuple(raw_order) if isinstance(raw_order, list) else config.order)
    if step.emulator is not None:
        # Here, not at the top: the emulator package brings its HTTP server along.
        from router.emulator.versions import DEFAULT_LOAD_S

        load_s = DEFAULT_LOAD_S if step.emulator.load_s is None else step.emulator.load_s
        aliases: tuple[str, ...] = (stable_name,)
    else:
        load_s, aliases = config.load_estimate_s, ()
    return SimRolloutSpec(
        version=step.version,
        load_s=load_s,
        floor=config.floor,
        order=order,
        drain_timeout_s=config.drain_timeout_s,
        on_drain_timeout="preempt" if config.on_drain_timeout == "preempt" else "wait",
        check_interval_s=config.check_interval_s,
        aliases=aliases,
    )


class SimScenarioRollout:
    """The run's one rollout on the simulator: ``start`` at the step's time, ``outcome`` at
    the end."""

    def __init__(self, sim: Simulation, control: ControlSurface, stable_name: str) -> None:
        self.sim = sim
        self.control = control
        self.stable_name = stable_name
        self.rollout: SimulatedRollout | None = None
        self._step: RolloutStep | None = None

    def start(self, step: RolloutStep) -> tuple[bool, str]:
        """Start it; whether the simulated router accepted it, and the plan or why not."""
        try:
            spec = sim_spec(step, self.sim.fleet, self.stable_name)
            rollout = SimulatedRollout(self.sim, self.control, spec, actor=ACTOR)
        except (RolloutError, ConfigError) as exc:
            return False, str(exc)
        rollout.start()
        self.rollout, self._step = rollout, step
        waves = " | ".join(", ".join(w.replicas) for w in rollout.plan.waves)
        return True, (
            f"{rollout.id}: {step.version} in {len(rollout.plan.waves)} waves ({waves}), "
            f"capacity kept >= {rollout.plan.lowest:.0%}"
        )

    def outcome(self) -> RolloutOutcome | None:
        """What it did; None when it never started."""
        if self.rollout is None or self._step is None:
            return None
        r = self.rollout
        status = r.status().to_dict()
        figures = r.figures()
        traffic = None if figures is None else figures.to_dict()
        return RolloutOutcome(
            self._step.version, r.started_at, r.ended_at, status, dict(r.served), traffic
        )
