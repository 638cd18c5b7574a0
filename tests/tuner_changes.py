"""Real tuner changes for tests: a core with adaptive batch sizes on, driven until it moves one.

The rule these tests lean on is the plainest one a batch tuner has: a replica that fills every
slot while its engine says it is not overloaded (an empty engine queue) may take more work.
Tests that only check rendering build a :class:`~router.adaptive.TunerChange` by hand
instead.
"""

from __future__ import annotations

import random
from dataclasses import replace

from router.adaptive import TunerChange
from router.clock import ManualClock
from router.config.schema import AdaptiveConfig, FleetConfig
from router.core import RouterCore
from router.replica import EngineLoad
from router.request import Request
from tests.fleet_factory import make_fleet

ADAPTIVE = AdaptiveConfig(
    batch_sizes=True, hysteresis=2, interval_s=0.01, grow_past_batch_size=True
)
"""Adaptive batch sizes on, allowed past the fleet file's sizes (the replicas start there);
``interval_s`` short for tests that run the driver's timer."""

MAX_ROUNDS = 10


def tuning_fleet(fleet: FleetConfig | None = None) -> FleetConfig:
    """``fleet`` (by default :func:`make_fleet`'s, batch size 4 each) with adaptive batch
    sizes on."""
    fleet = fleet or make_fleet()
    return replace(fleet, router=replace(fleet.router, adaptive=ADAPTIVE))


def tuning_core(fleet: FleetConfig | None = None) -> tuple[RouterCore, ManualClock]:
    clock = ManualClock(1000.0)
    return RouterCore(tuning_fleet(fleet), clock=clock, rng=random.Random(0)), clock


def saturate(core: RouterCore, clock: ManualClock) -> None:
    """More requests than slots, and fresh engine readings with an empty engine queue: every
    replica is full and nothing says it is overloaded."""
    slots = sum(r.batch_size for r in core.pool)
    for i in range(2 * slots):
        core.submit(Request(f"tune-{i}", 100, 32, arrival=clock()))
    for r in core.pool:
        r.engine = EngineLoad("vllm", received_at=clock(), waiting=0, running=r.in_flight)


def drive_a_tuner_change(core: RouterCore, clock: ManualClock) -> list[TunerChange]:
    """Saturate the fleet, then run tuner rounds until one changes something; its changes."""
    saturate(core, clock)
    for _ in range(MAX_ROUNDS):
        for r in core.pool:  # the engine metrics poller's fresh reading each round
            r.engine = EngineLoad("vllm", received_at=clock(), waiting=0, running=r.in_flight)
        changes = core.tune()
        if changes:
            return changes
        clock.advance(ADAPTIVE.interval_s)
    raise AssertionError(f"no tuner change in {MAX_ROUNDS} rounds")
