"""A scenario's offered load: its phases as rates, and the fleet's capacity on each mix.

``load`` in a phase is a multiple of the fleet's capacity_rps on that phase's length mix:
the sum of each replica's saturation throughput, measured by the simulator
(``router.sim.runner.fleet_capacity``, seed 0), as ``gpurouter sim`` reports it. A phase's
``max_tokens`` cap cuts the lengths the engines generate, so it is part of the mix. Both the
simulator and a live run send the same shots (``router.loadgen.schedule``) from the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator

from router.errors import ConfigError, Problem
from router.loadgen import RatePhase, Shot, schedule
from router.perf.profiles import UnknownProfileError
from router.scenario.schema import Lengths, Phase, Scenario
from router.sim.runner import fleet_capacity
from router.sim.workload import (
    CappedMix,
    LengthMix,
    LognormalMix,
    TraceMix,
    bundled_trace,
    load_trace,
)

__all__ = ["Workload"]

_Mix = tuple[Lengths, int | None]
"""A phase's lengths and its max_tokens cap: what its engines generate."""

_MEASURED: dict[tuple[object, ...], float | None] = {}
"""Capacities measured in this process, by replicas, profiles and mix: measuring takes about
a second per kind of replica, and scenarios on one fleet share it."""


def length_mix(lengths: Lengths, max_tokens: int | None = None) -> LengthMix:
    """The lengths engines generate: the source's, outputs cut at ``max_tokens`` if given."""
    mix: LengthMix
    if lengths.trace is not None:
        mix = TraceMix(bundled_trace(lengths.trace))
    elif lengths.csv is not None:
        mix = TraceMix(load_trace(lengths.csv))
    else:
        assert lengths.lognormal is not None
        mix = LognormalMix(*lengths.lognormal)
    return mix if max_tokens is None else CappedMix(mix, max_tokens)


def _mix_of(phase: Phase) -> _Mix:
    return phase.lengths, phase.max_tokens


class Workload:
    """The phases of a scenario with their mixes and capacities, measured once each."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.mixes: dict[_Mix, LengthMix] = {}
        """By lengths and max_tokens cap."""
        self._capacity: dict[_Mix, float | None] = {}
        for phase in scenario.phases:
            key = _mix_of(phase)
            if key not in self.mixes:
                self.mixes[key] = length_mix(*key)

    def capacity(self, mix: _Mix) -> float | None:
        """The fleet's capacity_rps on this mix; None when a replica has no profile."""
        if mix not in self._capacity:
            fleet = self.scenario.fleet.config
            key = (fleet.replicas, fleet.profiles, mix)
            if key not in _MEASURED:
                try:
                    _MEASURED[key] = sum(fleet_capacity(fleet, self.mixes[mix]).values())
                except UnknownProfileError:
                    _MEASURED[key] = None
            self._capacity[mix] = _MEASURED[key]
        return self._capacity[mix]

    def capacity_at(self, t: float) -> float | None:
        return self.capacity(_mix_of(self.scenario.phase_at(t)))

    def known_capacity(self) -> float | None:
        """The first phase's capacity if it was measured already (measuring costs seconds)."""
        return self._capacity.get(_mix_of(self.scenario.phases[0]))

    def rate(self, phase: Phase) -> float:
        if phase.rate_rps is not None:
            return phase.rate_rps
        assert phase.load is not None
        capacity = self.capacity(_mix_of(phase))
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
                mix=self.mixes[_mix_of(p)],
                burstiness=p.burstiness if p.arrivals == "gamma" else 1.0,
                priorities=p.priorities,
                max_tokens=p.max_tokens,
            )
            for p in self.scenario.phases
        ]

    def shots(self) -> Iterator[Shot]:
        return schedule(self.rate_phases(), self.scenario.seed)
