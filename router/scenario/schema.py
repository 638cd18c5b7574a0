"""A scenario, typed and frozen: the fleet, the workload's phases, timed actions, checks.

``router.scenario.loader`` builds these from YAML and nothing else does, so the runners can
trust every value: times are non-negative, rates positive, every replica named exists in the
fleet. All times are seconds of scenario time from the start of the run (virtual seconds in
the simulator, emulated seconds live). docs/scenarios.md is the reference for each key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from router.config.schema import FleetConfig
from router.control import Command, command_args, command_name
from router.request import Priority
from router.scenario.canary_step import CanaryStep
from router.scenario.rollout_step import RolloutStep

FaultKind = Literal["kill", "revive", "heal", "slow", "fail_fraction"]
FAULTS: tuple[FaultKind, ...] = ("kill", "revive", "heal", "slow", "fail_fraction")


@dataclass(frozen=True, slots=True)
class FleetRef:
    """Which fleet the scenario runs on, and how a live run reaches it."""

    file: Path
    """The fleet file (written relative to the scenario file)."""
    config: FleetConfig
    """The fleet file, read and checked."""
    emulated: bool = True
    """Live runs serve the fleet's replicas with the emulator; false: its endpoints are real."""
    time_scale: float = 1.0
    """Live emulated runs: the emulator runs this many times faster than life."""


@dataclass(frozen=True, slots=True)
class Lengths:
    """Where request lengths come from: exactly one of the three."""

    trace: str | None = None
    """``conv`` or ``code``: a bundled Azure trace's rows."""
    csv: Path | None = None
    """A CSV with TIMESTAMP, ContextTokens, GeneratedTokens (relative to the scenario)."""
    lognormal: tuple[tuple[float, float], tuple[float, float]] | None = None
    """((prompt median, prompt mean), (output median, output mean)) in tokens."""

    def describe(self) -> str:
        if self.trace is not None:
            return f"trace {self.trace}"
        if self.csv is not None:
            return f"csv {self.csv}"
        return f"lognormal {self.lognormal}"


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of steady offered load."""

    start_s: float
    """When the phase starts (the sum of the durations before it)."""
    duration_s: float
    rate_rps: float | None
    """Arrivals per second, or None when ``load`` gives it."""
    load: float | None
    """Arrivals as a multiple of the fleet's capacity_rps on this phase's length mix."""
    arrivals: Literal["poisson", "gamma"]
    burstiness: float
    """Gamma shape (1 is Poisson, smaller is burstier)."""
    lengths: Lengths
    priorities: Mapping[Priority, float]
    """Share of each priority among the phase's requests (sums to 1)."""
    name: str = ""
    max_tokens: int | None = None
    """What every client sends as ``max_tokens``; None: each request's own output length.
    The engine stops at the request's output length either way (cut at this cap)."""

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True)
class Action:
    """One timed operator command, fault or rollout."""

    at_s: float
    line: int
    """Where it is written, for messages at run time."""
    command: Command | None = None
    """A control command (as ``gpurouter ctl`` or the console would send)."""
    fault: FaultKind | None = None
    """A fault set on an emulated (or simulated) replica."""
    replica: str | None = None
    factor: float = 1.0
    """``slow``: how many times longer each engine step takes."""
    fraction: float = 0.0
    """``fail_fraction``: the share of attempts answered with a 500."""
    rollout: RolloutStep | None = None
    """A model rollout started through the router's rollout manager (live or simulated)."""
    canary: CanaryStep | None = None
    """A canary started through the router's traffic splits (live or simulated)."""
    version: str | None = None
    """``slow``, ``fail_fraction``: the version they stand for (live: they end when the
    replica restarts onto another); None: the replica's, whatever it runs."""

    def describe(self) -> str:
        if self.rollout is not None:
            return self.rollout.describe()
        if self.canary is not None:
            return self.canary.describe()
        if self.command is not None:
            args = ", ".join(f"{k}={v}" for k, v in command_args(self.command).items() if v)
            return f"{command_name(self.command)} {args}".strip()
        detail = {"slow": f" x{self.factor:g}", "fail_fraction": f" {self.fraction:g}"}
        of = "" if self.version is None else f" (of {self.version})"
        return f"{self.fault} {self.replica}{detail.get(self.fault or '', '')}{of}"


@dataclass(frozen=True, slots=True)
class Check:
    """A condition on what was measured, over a window of scenario time."""

    name: str
    metric: str
    line: int
    start_s: float = 0.0
    """Window start (``from``)."""
    end_s: float | None = None
    """Window end (``to``); None: the end of the run."""
    at_s: float | None = None
    """``state``: the instant to look at."""
    replica: str | None = None
    priority: Priority | None = None
    minimum: float | None = None
    maximum: float | None = None
    equals: str | None = None
    aggregate: Literal["all", "mean"] = "all"
    """Per-second metrics: every sample must hold (``all``), or their mean (``mean``)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: Path
    fleet: FleetRef
    phases: tuple[Phase, ...]
    actions: tuple[Action, ...]
    """In time order (file order among equal times)."""
    checks: tuple[Check, ...]
    description: str = ""
    strategy: str | None = None
    """The starting strategy; None keeps the fleet file's."""
    strategy_params: Mapping[str, object] | None = None
    seed: int = 0
    drain_s: float = 30.0
    """After the last phase, how long in-flight work may take to finish."""

    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s if self.phases else 0.0

    def phase_at(self, t: float) -> Phase:
        """The phase in effect at ``t`` (the last one after the end)."""
        for phase in self.phases:
            if t < phase.end_s:
                return phase
        return self.phases[-1]
