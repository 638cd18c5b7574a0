"""A scenario's canary step on the simulator (``gpurouter run --simulate``).

The step is read as live (router/scenario/canary_step.py): the rules are the fleet file's
``rollout.canary`` under the step's own ``canary:``, in scenario seconds, and the rollouts
that move the canary replicas take the step's ``rollout:`` keys (router/scenario/sim_rollout.py:
the emulator updater's ``load_s``, else ``load_estimate_s``). The stable name, the old version
and the replicas' own names are found as live (router/rollout/splits.py), and the canary runs
as router/rollout/simulated_canary.py. In the simulator the canary replicas always serve the
new version under the stable name too (a canary's replicas must, or they get none of its
requests): the emulator updater does so live. The outcome is the record a live run keeps,
with what each simulated replica would list on ``/v1/models``, so the same checks read it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from router.config.loader import parse_rollout_settings
from router.control import ControlSurface
from router.errors import ConfigError, RolloutError
from router.rollout.simulated_canary import SimCanarySpec, SimulatedCanary
from router.scenario.canary_step import CanaryStep
from router.scenario.recording import CanaryOutcome
from router.scenario.sim_rollout import sim_spec
from router.sim.simulator import Simulation

__all__ = ["SimScenarioCanary", "canary_spec"]

ACTOR = "scenario"


def canary_spec(step: CanaryStep, sim: Simulation) -> SimCanarySpec:
    """The simulated canary a step describes; RolloutError as live (no old version to compare
    with, replicas of several models), ConfigError for a setting the loader let by."""
    core = sim.core
    models = {core.replica(rid).config.model for rid in step.replicas}
    if len(models) != 1:
        raise RolloutError(f"the canary replicas serve several models: {sorted(models)}")
    model = models.pop()
    new = step.version
    others = Counter(
        r.version
        for r in core.pool
        if r.id not in step.replicas and r.serves(model) and r.version != new
    )
    if not others:
        raise RolloutError(f"no other replica serves {model}: nothing to compare {new} with")
    old = others.most_common(1)[0][0]
    own = {k: v for k, v in step.rollout.settings.items() if k != "order"}
    config = parse_rollout_settings(own, sim.fleet.rollout)
    has_updater = step.rollout.emulator is not None or config.updater is not None
    rollout = None
    if has_updater:
        rollout = replace(sim_spec(step.rollout, sim.fleet, model), aliases=(model,))
    return SimCanarySpec(model, old, new, step.replicas, config.canary, not step.manual, rollout)


class SimScenarioCanary:
    """The run's one canary on the simulator: ``start`` at the step's time, ``outcome`` at
    the end."""

    def __init__(self, sim: Simulation, control: ControlSurface) -> None:
        self.sim = sim
        self.control = control
        self.canary: SimulatedCanary | None = None
        self._step: CanaryStep | None = None

    def start(self, step: CanaryStep) -> tuple[bool, str]:
        """Start it; whether the simulated router accepted it, and what it does or why not."""
        try:
            canary = SimulatedCanary(
                self.sim, self.control, canary_spec(step, self.sim), actor=ACTOR
            )
        except (RolloutError, ConfigError) as exc:
            return False, str(exc)
        canary.start()
        self.canary, self._step = canary, step
        s = canary.spec
        return True, f"{canary.id}: {s.new} on {', '.join(s.replicas)} beside {s.old}"

    def outcome(self) -> CanaryOutcome | None:
        """What it did; None when it never started."""
        canary, step = self.canary, self._step
        if canary is None or step is None or canary.started_at is None:
            return None
        served: dict[str, tuple[str, ...] | None] = {
            r.id: self.sim.served[r.index] for r in self.sim.core.pool
        }
        return CanaryOutcome(
            step.version,
            canary.started_at,
            canary.ended_at,
            canary.status(),
            served,
            rolled_back_at=canary.rolled_back_at,
        )
