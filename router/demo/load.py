"""The demo's offered load: a rate that swings between two fractions of the fleet's capacity,
with bursty (gamma) arrivals, for as long as the demo runs.

The capacity is the sum of the replicas' saturation throughputs on the bundled ``conv`` trace
(:func:`router.sim.runner.fleet_capacity`), so "0.9" means 90% of what the fleet could
serve if every request went to the right place: round-robin cannot keep up with that on a
mixed fleet, a capacity-aware strategy can. Times and rates are in emulated seconds; the
load generator divides them by the emulator's time scale.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from router.config.schema import FleetConfig
from router.loadgen import RatePhase, Shot, schedule
from router.sim.workload import LengthMix, TraceMix, bundled_trace

__all__ = [
    "DemoLoad",
    "RatedSpan",
    "conv_mix",
    "demo_capacity_rps",
    "offered_rps",
    "swing_phases",
    "swinging_shots",
]


@dataclass(frozen=True, slots=True)
class DemoLoad:
    """How hard the demo pushes the fleet."""

    low: float = 0.5
    """The calm phases' rate, as a fraction of the fleet's capacity."""
    high: float = 0.9
    """The busy phases' rate, as a fraction of the fleet's capacity."""
    phase_s: float = 15.0
    """Wall seconds each phase lasts (emulated seconds are this times the time scale)."""
    burstiness: float = 0.5
    """Gamma shape of the gaps between requests: 1 is Poisson, smaller is burstier."""

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise ValueError(f"load fractions need 0 < low <= high, got {self.low}, {self.high}")
        if self.phase_s <= 0 or self.burstiness <= 0:
            raise ValueError("phase length and burstiness must be > 0")


def conv_mix() -> LengthMix:
    """The bundled Azure conversation trace's lengths."""
    return TraceMix(bundled_trace("conv"))


def demo_capacity_rps(fleet: FleetConfig, mix: LengthMix) -> float:
    """Requests per emulated second the whole fleet sustains on ``mix`` (its physical limit)."""
    from router.sim.runner import fleet_capacity  # the simulator is only needed here

    return sum(fleet_capacity(fleet, mix).values())


def swing_phases(
    load: DemoLoad, capacity_rps: float, mix: LengthMix, time_scale: float
) -> list[RatePhase]:
    """One cycle: calm, busy, middling, busy (so the rate does not just flip between two)."""
    middle = (load.low + load.high) / 2
    duration = load.phase_s * time_scale
    return [
        RatePhase(duration, capacity_rps * f, mix, burstiness=load.burstiness)
        for f in (load.low, load.high, middle, load.high)
    ]


def swinging_shots(
    phases: list[RatePhase], seed: int, stopped: Callable[[], bool]
) -> Iterator[Shot]:
    """The cycle of ``phases`` repeated, each cycle with its own seed, until ``stopped()``."""
    cycle_s = sum(p.duration_s for p in phases)
    for n in itertools.count():
        for shot in schedule(phases, seed + n):
            if stopped():
                return
            yield dataclasses.replace(shot, at_s=shot.at_s + n * cycle_s)


class RatedSpan(Protocol):
    """A stretch of the schedule: a RatePhase, or its rate and length alone."""

    @property
    def duration_s(self) -> float: ...

    @property
    def rate_rps(self) -> float: ...


def offered_rps(phases: Sequence[RatedSpan], at_s: float) -> float:
    """The scheduled rate at ``at_s`` emulated seconds from the start."""
    cycle_s = sum(p.duration_s for p in phases)
    t = at_s % cycle_s
    for phase in phases:
        if t < phase.duration_s:
            return phase.rate_rps
        t -= phase.duration_s
    return phases[-1].rate_rps
