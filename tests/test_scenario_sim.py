"""The simulator's additions for scripted runs: timed callbacks, priorities and faults."""

from __future__ import annotations

import random

from router.config import load_fleet
from router.replica import ReplicaState
from router.request import Priority, Request
from router.sim.simulator import Simulation
from router.sim.workload import Arrival, LognormalMix, poisson
from tests.scenario_helpers import MIXED

MIX = LognormalMix((200, 300), (100, 150))


def arrivals(rate: float, duration: float) -> list[Arrival]:
    return list(poisson(rate, duration, MIX, random.Random(0)))


def test_callbacks_run_at_their_virtual_times_in_order() -> None:
    sim = Simulation(load_fleet(MIXED), "round-robin")
    seen: list[tuple[str, float]] = []
    sim.at(2.5, lambda: seen.append(("b", sim.clock.now)))
    sim.at(1.0, lambda: seen.append(("a", sim.clock.now)))
    sim.at(2.5, lambda: seen.append(("c", sim.clock.now)))
    sim.run(arrivals(5, 5), 5)
    assert seen == [("a", 1.0), ("b", 2.5), ("c", 2.5)]


def test_a_plain_run_is_unchanged_by_the_fault_machinery() -> None:
    """No fault set: nothing fails, nothing is ejected, as before."""
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections")
    result = sim.run(arrivals(20, 10), 10)
    assert (result.failed, result.lost_requests) == (0, 0)
    assert all(r.state is ReplicaState.ACTIVE for r in sim.core.pool)


def test_make_request_lets_a_subclass_set_the_priority() -> None:
    class High(Simulation):
        def make_request(self, request_id: str, arrival: Arrival) -> Request:
            request = super().make_request(request_id, arrival)
            request.priority = Priority.HIGH
            return request

    sim = High(load_fleet(MIXED), "round-robin")
    priorities: list[Priority] = []
    sim.at(1.0, lambda: priorities.extend(a.request.priority for a in sim.core.running.values()))
    sim.run(arrivals(20, 2), 2)
    assert priorities
    assert set(priorities) == {Priority.HIGH}


def test_a_killed_replica_is_ejected_and_readmitted_once_revived() -> None:
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections")
    states: dict[float, ReplicaState] = {}

    def look(t: float) -> None:
        states[t] = sim.core.replica("a100-0").state

    sim.at(5.0, lambda: sim.kill("a100-0"))
    sim.at(6.0, lambda: look(6.0))
    sim.at(8.0, lambda: sim.revive("a100-0"))
    sim.at(9.0, lambda: look(9.0))
    sim.at(11.0, lambda: look(11.0))
    result = sim.run(arrivals(20, 20), 20)
    # Ejected by the health monitor after failed attempts; probed at every health check
    # (5 s) during its 10 s window, it is back at the first probe after its revival, long
    # before the window ends.
    assert states == {
        6.0: ReplicaState.EJECTED,
        9.0: ReplicaState.EJECTED,
        11.0: ReplicaState.ACTIVE,
    }
    assert result.lost_requests == 0
    assert result.completed + result.failed == result.offered


def test_a_replica_that_stays_dead_stays_out() -> None:
    sim = Simulation(load_fleet(MIXED), "weighted-least-connections")
    sim.at(1.0, lambda: sim.kill("v100-0"))
    result = sim.run(arrivals(20, 30), 30)
    assert sim.core.replica("v100-0").state is ReplicaState.EJECTED
    assert result.lost_requests == 0


def test_a_failing_replica_s_requests_are_retried_elsewhere() -> None:
    """Attempts answered 500 before any byte are re-run on another replica: none fails."""
    sim = Simulation(load_fleet(MIXED), "round-robin")
    states: list[ReplicaState] = []
    sim.at(0.0, lambda: sim.fail_fraction("v100-1", 1.0))
    sim.at(5.0, lambda: states.append(sim.core.replica("v100-1").state))
    result = sim.run(arrivals(20, 10), 10)
    assert result.failed == 0
    assert result.completed == result.offered
    # Five failures in a row eject it; its health probe still answers, so the window ends it.
    assert states == [ReplicaState.EJECTED]
    assert sim.core.replica("v100-1").state is ReplicaState.ACTIVE
    assert sim.core.stats[sim.core.replica("v100-1").index].retries >= 5


def test_a_slowed_replica_takes_longer() -> None:
    def e2e_on_a100_0(factor: float) -> float:
        sim = Simulation(load_fleet(MIXED), "round-robin")
        sim.at(0.0, lambda: sim.slow("a100-0", factor))
        sim.run(arrivals(10, 10), 10)
        return max(sim.core.stats[0].e2e.values())

    assert e2e_on_a100_0(10.0) > 3 * e2e_on_a100_0(1.0)
