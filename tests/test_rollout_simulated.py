"""A rollout on the fleet simulator: the live plan run wave by wave on virtual time, keeping
the floor at every instant and ending with every replica on the new version, nothing lost."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from router.config import load_fleet
from router.control import ControlSurface
from router.core import CoreListener
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.rollout.executor import Phase, Step
from router.rollout.simulated import SimRolloutSpec, SimulatedRollout
from router.sim.simulator import SimResult, Simulation
from router.sim.workload import LognormalMix, poisson

MIXED = Path(__file__).parent.parent / "examples" / "fleets" / "mixed-a100-v100.yaml"
MIX = LognormalMix((200.0, 300.0), (60.0, 100.0))
DURATION = 150.0


class _ShareWatch(CoreListener):
    """The share of the plan's capacity in service, read at every state change."""

    def __init__(self, rollout: SimulatedRollout) -> None:
        self.rollout = rollout
        self.shares: list[float] = []

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        capacity = self.rollout.capacity
        active = sum(
            c
            for rid, c in capacity.items()
            if self.rollout.core.replica(rid).state is ReplicaState.ACTIVE
        )
        self.shares.append(active / sum(capacity.values()))


def _run(spec: SimRolloutSpec, rate: float = 12.0, seed: int = 5) -> tuple[
    Simulation, SimulatedRollout, _ShareWatch, SimResult
]:  # fmt: skip
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections", seed=seed)
    control = ControlSurface(sim.core, wall_clock=lambda: sim.clock.now)
    rollouts: list[SimulatedRollout] = []
    watches: list[_ShareWatch] = []

    def start() -> None:
        rollout = SimulatedRollout(sim, control, spec)
        watch = _ShareWatch(rollout)
        sim.core.listeners.append(watch)
        rollout.start()
        rollouts.append(rollout)
        watches.append(watch)

    sim.at(10.0, start)
    result = sim.run(poisson(rate, DURATION, MIX, random.Random(seed)), DURATION, drain_s=60.0)
    return sim, rollouts[0], watches[0], result


def test_a_simulated_rollout_keeps_the_floor_and_ends_on_the_new_version() -> None:
    spec = SimRolloutSpec("llama-v2", load_s=7.0, floor=0.75, aliases=("llama",))
    sim, rollout, watch, result = _run(spec)
    status = rollout.status()
    assert status.phase is Phase.DONE
    assert set(status.steps.values()) == {Step.UPDATED}
    assert set(status.versions.values()) == {"llama-v2"}
    assert all(served == ("llama-v2", "llama") for served in rollout.served.values())
    assert all(r.state is ReplicaState.ACTIVE for r in sim.core.pool)
    # Every replica left service once and came back: the floor held at every change.
    assert len(watch.shares) >= 2 * len(rollout.plan.order)
    assert min(watch.shares) >= 0.75 - 1e-9
    assert status.capacity_lowest == pytest.approx(min(watch.shares))
    assert len(rollout.plan.waves) > 1
    # Nothing lost to it: every request of the run ended, and well.
    assert result.lost_requests == 0
    assert result.failed == 0
    assert result.completed == result.offered


def test_each_replica_is_out_for_its_load_time_rounded_up_to_a_readiness_check() -> None:
    spec = SimRolloutSpec("llama-v2", load_s=7.0, floor=0.75, check_interval_s=2.0)
    assert spec.back_after_s() == 8.0
    _, rollout, _, _ = _run(spec, rate=0.5)
    figures = rollout.figures()
    assert figures is not None
    assert figures.duration_s is not None
    # A light load drains in a moment: the rollout lasts about its waves' load times.
    waves = len(rollout.plan.waves)
    assert 8.0 * waves <= figures.duration_s < 8.0 * waves + 30.0


def test_the_same_seed_gives_the_same_rollout() -> None:
    spec = SimRolloutSpec("llama-v2", load_s=5.0, floor=0.75)
    _, a, _, _ = _run(spec)
    _, b, _, _ = _run(spec)
    assert a.figures() == b.figures()
    assert a.status() == b.status()


def test_past_the_drain_deadline_preempt_moves_the_requests_and_none_is_lost() -> None:
    spec = SimRolloutSpec(
        "llama-v2", load_s=5.0, floor=0.75, drain_timeout_s=0.5, on_drain_timeout="preempt"
    )
    _, rollout, _, result = _run(spec, rate=20.0)
    status = rollout.status()
    assert status.phase is Phase.DONE
    assert status.requests_moved > 0
    assert result.lost_requests == 0
    assert result.completed + result.failed + result.rejected == result.offered


def test_a_floor_the_plan_cannot_keep_is_refused_as_live() -> None:
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections", seed=1)
    control = ControlSurface(sim.core, wall_clock=lambda: sim.clock.now)
    with pytest.raises(RolloutError, match="under the floor of 95%"):
        SimulatedRollout(sim, control, SimRolloutSpec("v2", load_s=5.0, floor=0.95))


def test_a_rollout_of_some_replicas_counts_the_rest_and_rolls_back_to_the_old_version() -> None:
    """As live for a canary's replicas: only they are planned, the rest of the fleet's capacity
    in service counts toward the floor, and a rollback puts each back on its old version."""
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections", seed=3)
    control = ControlSurface(sim.core, wall_clock=lambda: sim.clock.now)
    spec = SimRolloutSpec(
        "llama-v2", load_s=4.0, floor=0.75, aliases=("llama",), replicas=("v100-0", "v100-1")
    )
    rollout = SimulatedRollout(sim, control, spec)
    assert set(rollout.plan.order) == {"v100-0", "v100-1"}
    assert len(rollout.plan.waves) == 1  # two V100s out leave well over 75% in service
    ends: list[str] = []

    def back() -> None:
        ends.append(f"back at {sim.clock.now:g}")

    def done() -> None:
        ends.append(f"done at {sim.clock.now:g}")
        assert {sim.core.replica(r).version for r in ("v100-0", "v100-1")} == {"llama-v2"}
        assert sim.core.replica("v100-2").version != "llama-v2"
        rollout.rollback(then=back)

    sim.at(5.0, lambda: rollout.start(then=done))
    arrivals = poisson(4.0, 60.0, MIX, random.Random(3))
    result = sim.run(arrivals, 60.0, drain_s=30.0)
    assert [e.split(" at ")[0] for e in ends] == ["done", "back"]
    status = rollout.status()
    assert status.phase is Phase.ROLLED_BACK
    assert set(status.steps.values()) == {Step.ROLLED_BACK}
    old = "meta-llama/Llama-3.1-8B-Instruct"
    assert all(sim.served[sim.core.replica(r).index] == (old, "llama") for r in status.steps)
    assert all(r.version == old and r.state is ReplicaState.ACTIVE for r in sim.core.pool)
    assert status.capacity_lowest >= 0.75
    assert result.lost_requests == 0
