"""A scenario's offered load: its phases as rates, and the fleet's capacity on each mix.

``load`` in a phase is a multiple of the fleet's capacity_rps on that phase's length mix:
the sum of each replica's saturation throughput, measured by the simulator
(``router.sim.runner.fleet_capacity``, seed 0), as ``gpurouter sim`` reports it. Both the simulator
and a live run send the same shots (``router.loadgen.schedule``) from the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator

from router.errors import ConfigError, Problem
from router.loadgen import RatePhase, Shot, schedule
from router.perf.profiles import UnknownProfileError
from router.scenario.schema import Lengths, Phase, Scenario
from router.sim.runner import fleet_capacity
from router.sim.workload import LengthMix, LognormalMix, TraceMix, bundled_trace, load_trace

__all__ = ["Workload"]

_MEASURED: dict[tuple[object, ...], float | None] = {}
"""Capacities measured in this process, by replicas, profiles and mix: measuring takes about
a second per kind of replica, and scenarios on one fleet share it."""


def length_mix(lengths: Lengths) -> LengthMix:
    if lengths.trace is not None:
        return TraceMix(bundled_trace(lengths.trace))
    if lengths.csv is not None:
        return TraceMix(load_trace(lengths.csv))
    assert lengths.lognormal is not None
    return LognormalMix(*lengths.lognormal)


class Workload:
    """The phases of a scenario with their mixes and capacities, measured once each."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.mixes: dict[Lengths, LengthMix] = {}
        self._capacity: dict[Lengths, float | None] = {}
        for phase in scenario.phases:
            if phase.lengths not in self.mixes:
                self.mixes[phase.lengths] = length_mix(phase.lengths)

    def capacity(self, lengths: Lengths) -> float | None:
        """The fleet's capacity_rps on this mix; None when a replica has no profile."""
        if lengths not in self._capacity:
            fleet = self.scenario.fleet.config
            key = (fleet.replicas, fleet.profiles, lengths)
            if key not in _MEASURED:
                try:
                    _MEASURED[key] = sum(fleet_capacity(fleet, self.mixes[lengths]).values())
                except UnknownProfileError:
                    _MEASURED[key] = None
            self._capacity[lengths] = _MEASURED[key]
        return self._capacity[lengths]

    def capacity_at(self, t: float) -> float | None:
        return self.capacity(self.scenario.phase_at(t).lengths)

    def known_capacity(self) -> float | None:
        """The first phase's capacity if it was measured already (measuring costs seconds)."""
        lengths = self.scenario.phases[0].lengths
        return self._capacity.get(lengths)

    def rate(self, phase: Phase) -> float:
        if phase.rate_rps is not None:
            return phase.rate_rps
        assert phase.load is not None
        capacity = self.capacity(phase.lengths)
        if capacity is None:
            i = self.scenario.phases.index(phase)
            message = (
                "load needs the fleet's capacity, and a replica's GPU or model has no "
                "performance profile; give rate instead, or add a profile to the fleet"
            )
            problem = Problem(
                str(self.scenario.source), None, f"workload.phases[{i}].load", message
            )
            raise ConfigError([problem])
        return phase.load * capacity

    def rate_phases(self) -> list[RatePhase]:
        return [
            RatePhase(
                duration_s=p.duration_s,
                rate_rps=self.rate(p),
                mix=self.mixes[p.lengths],
                burstiness=p.burstiness if p.arrivals == "gamma" else 1.0,
                priorities=p.priorities,
            )
            for p in self.scenario.phases
        ]

    def shots(self) -> Iterator[Shot]:
        return schedule(self.rate_phases(), self.scenario.seed)
