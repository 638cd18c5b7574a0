"""Several routers in front of one simulated fleet (router/sim/routers.py), with and without
each other's load (router/peer_load.py)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.sim.routers import Balancer, Routers
from router.sim.runner import KEEP_UP, Run, Workload, fleet_capacity, simulate, trace_rows

FLEETS = Path(__file__).parent.parent / "examples" / "fleets"


def _weights_at_one(fleet: FleetConfig) -> FleetConfig:
    nodes = tuple(
        dataclasses.replace(
            n, replicas=tuple(dataclasses.replace(r, weight=1.0) for r in n.replicas)
        )
        for n in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Round-robin at 90% of capacity on the mixed fleet with its V100s' batch size at 64 and
    every weight at 1: one router, four sharing their load, four that do not."""
    fleet = _weights_at_one(load_fleet(FLEETS / "mixed-a100-v100-tuned.yaml"))
    conv = Workload(trace_rows("conv"))
    capacities = fleet_capacity(load_fleet(FLEETS / "mixed-a100-v100.yaml"), conv.mix)
    rate = 0.9 * sum(capacities.values())

    def run(routers: Routers) -> Run:
        return simulate(fleet, "round-robin", conv, rate, 120.0, 1, capacities, routers=routers)

    return {
        "one": run(Routers(1)),
        "sharing": run(Routers(4, sharing=True)),
        "alone": run(Routers(4, sharing=False)),
    }


def test_four_routers_sharing_their_load_serve_what_one_router_serves(
    runs: dict[str, Run],
) -> None:
    """The V100s' batch size is shared by the four: what they cannot take waits in the
    routers' queues until any replica frees a slot, as with one router."""
    one, sharing = runs["one"], runs["sharing"]
    assert one.kept_up >= KEEP_UP
    assert sharing.kept_up >= KEEP_UP
    assert sharing.result.throughput_rps >= 0.97 * one.result.throughput_rps


def test_four_routers_that_do_not_share_serve_measurably_less(runs: dict[str, Run]) -> None:
    """Each lets 64 requests onto a V100, four times what it handles: a backlog grows in the
    V100s' engines that the A100s never see."""
    one, alone = runs["one"], runs["alone"]
    assert alone.kept_up < KEEP_UP
    assert alone.result.throughput_rps < 0.9 * one.result.throughput_rps


def test_no_request_is_lost_behind_several_routers(runs: dict[str, Run]) -> None:
    for run in runs.values():
        r = run.result
        assert r.lost_requests == 0
        assert r.completed + r.failed + r.rejected + r.expired + r.unfinished == r.offered


def test_the_balancer_spreads_arrivals_over_every_router() -> None:
    rr = Balancer(Routers(3), random.Random(0))
    assert [rr.pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    drawn = Balancer(Routers(3, balancer="random"), random.Random(0))
    assert {drawn.pick() for _ in range(60)} == {0, 1, 2}


def test_router_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Routers(0)
    with pytest.raises(ValueError, match="broker_delay_s"):
        Routers(2, broker_delay_s=(0.05, 0.01))
    with pytest.raises(ValueError, match="balancer"):
        Routers(2, balancer="least-busy")
