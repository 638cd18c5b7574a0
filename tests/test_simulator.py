"""The fleet simulator: the real core on a virtual clock, deterministic, nothing lost."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import pytest

from router.config import load_fleet
from router.config.schema import StrategyConfig
from router.core import RouterCore
from router.errors import ConfigError
from router.sim.runner import (
    KEEP_UP,
    Workload,
    batch_capacity,
    fleet_capacity,
    max_sustainable,
    run_strategy,
    simulate,
    trace_rows,
)
from router.sim.simulator import Simulation
from router.sim.workload import (
    LognormalMix,
    TraceMix,
    bundled_trace,
    gamma,
    load_trace,
    poisson,
    replay,
)

MIXED = Path(__file__).parent.parent / "examples" / "fleets" / "mixed-a100-v100.yaml"
TUNED = MIXED.with_name("mixed-a100-v100-tuned.yaml")


@pytest.fixture(scope="module")
def conv() -> Workload:
    return Workload(trace_rows("conv"))


@pytest.fixture(scope="module")
def capacities(conv: Workload) -> dict[str, float]:
    return fleet_capacity(load_fleet(MIXED), conv.mix)


def test_the_simulator_drives_the_real_router_core() -> None:
    sim = Simulation(load_fleet(MIXED), "round-robin", seed=1)
    assert type(sim.core) is RouterCore
    assert sim.core.strategy.name == "round-robin"


def test_the_fleet_files_params_go_with_its_own_strategy_only() -> None:
    """A fleet file's ``router.strategy.params`` are its strategy's: the simulator runs that
    strategy with them (so a parameter can be tried from a file), and any other without."""
    fleet = load_fleet(MIXED)
    sed = StrategyConfig("shortest-expected-delay", {"wait_weight": 2.0})
    fleet = dataclasses.replace(fleet, router=dataclasses.replace(fleet.router, strategy=sed))
    own = Simulation(fleet, "shortest-expected-delay", seed=1).core.strategy
    assert getattr(own, "wait_weight", None) == 2.0
    other = Simulation(fleet, "least-connections", seed=1)
    assert other.core.strategy.name == "least-connections"
    given = Simulation(fleet, "shortest-expected-delay", seed=1, strategy_params={})
    assert getattr(given.core.strategy, "wait_weight", None) == 5.0


def test_the_same_seed_gives_the_same_numbers(conv: Workload, capacities: dict[str, float]) -> None:
    fleet = load_fleet(MIXED)
    a = run_strategy(fleet, "p2c-peak-ewma", conv, 20.0, 60.0, 7, capacities)
    b = run_strategy(fleet, "p2c-peak-ewma", conv, 20.0, 60.0, 7, capacities)
    c = run_strategy(fleet, "p2c-peak-ewma", conv, 20.0, 60.0, 8, capacities)
    assert a == b
    assert a != c


def test_no_request_is_lost_and_the_counts_add_up(
    conv: Workload, capacities: dict[str, float]
) -> None:
    result = run_strategy(
        load_fleet(MIXED), "weighted-least-connections", conv, 30.0, 60.0, 3, capacities
    )
    assert result.lost_requests == 0
    endings = result.completed + result.failed + result.rejected + result.expired
    assert endings + result.unfinished == result.offered


def test_a100s_have_more_capacity_than_v100s(capacities: dict[str, float]) -> None:
    assert capacities["a100-0"] > 2 * capacities["v100-0"]


def test_round_robin_overloads_the_v100s_where_weighted_routing_does_not(
    conv: Workload, capacities: dict[str, float]
) -> None:
    """At 80% of the fleet's capacity, an equal share is more than a V100 can take."""
    fleet = load_fleet(MIXED)
    rate = 0.8 * sum(capacities.values())
    rr = run_strategy(fleet, "round-robin", conv, rate, 120.0, 1, capacities)
    wlc = run_strategy(fleet, "weighted-least-connections", conv, rate, 120.0, 1, capacities)
    # Load is work sent over learned capacity: round-robin sends a V100 more than it can do.
    assert rr.utilization_by_gpu_model()["V100-32GB"] > 1.0
    assert wlc.imbalance_factor < rr.imbalance_factor
    assert wlc.ttft_p99_s is not None
    assert rr.ttft_p99_s is None or rr.ttft_p99_s > wlc.ttft_p99_s


def test_with_batch_sizes_a_v100_can_handle_the_queue_rescues_round_robin(
    conv: Workload, capacities: dict[str, float]
) -> None:
    """Late binding: at 90% of capacity round-robin overloads V100s left at batch size 256,
    but with their batch size at 64 a request waits in the router for a free slot instead,
    and freed A100 slots take it, so round-robin keeps up with short first tokens."""
    rate = 0.9 * sum(capacities.values())
    untuned = simulate(load_fleet(MIXED), "round-robin", conv, rate, 200.0, 1, capacities)
    tuned = simulate(load_fleet(TUNED), "round-robin", conv, rate, 200.0, 1, capacities)
    assert tuned.kept_up >= KEEP_UP
    assert tuned.result.ttft_p99_s is not None
    assert untuned.result.ttft_p99_s is None or untuned.result.ttft_p99_s > 10 * (
        tuned.result.ttft_p99_s
    )
    assert (
        tuned.result.utilization_by_gpu_model()["A100-80GB"]
        > (untuned.result.utilization_by_gpu_model()["A100-80GB"])
    )


def test_a_run_past_capacity_does_not_keep_up_and_a_light_one_does(
    conv: Workload, capacities: dict[str, float]
) -> None:
    fleet = load_fleet(MIXED)
    capacity = sum(capacities.values())
    light = simulate(fleet, "weighted-least-connections", conv, 0.5 * capacity, 60.0, 2, capacities)
    heavy = simulate(fleet, "weighted-least-connections", conv, 1.5 * capacity, 60.0, 2, capacities)
    assert light.kept_up >= KEEP_UP
    assert heavy.kept_up < KEEP_UP
    assert light.arrival_rps == pytest.approx(0.5 * capacity, rel=0.1)


def test_batch_sizes_below_what_a_card_handles_lower_the_fleets_ceiling(
    conv: Workload, capacities: dict[str, float]
) -> None:
    ceiling = batch_capacity(load_fleet(TUNED), conv.mix)
    assert ceiling["a100-0"] <= capacities["a100-0"]
    assert ceiling["v100-0"] < capacities["v100-0"]
    assert ceiling["v100-0"] > 0.9 * capacities["v100-0"]


def test_max_sustainable_search_finds_a_rate_that_meets_the_slo(
    conv: Workload, capacities: dict[str, float]
) -> None:
    fleet = load_fleet(MIXED)
    capacity = sum(capacities.values())
    rate, at = max_sustainable(
        fleet,
        "weighted-least-connections",
        conv,
        capacity,
        capacities,
        duration=60.0,
        seed=0,
        steps=4,
    )
    assert 0 < rate <= 1.2 * capacity
    assert at is not None
    assert at.ttft_p99_s is not None
    assert at.ttft_p99_s <= 2.0


def test_poisson_arrivals_come_at_the_asked_rate() -> None:
    mix = LognormalMix((1000, 1155), (129, 211))
    arrivals = list(poisson(50.0, 200.0, mix, random.Random(0)))
    assert 9_500 < len(arrivals) < 10_500
    assert all(a.time < 200.0 for a in arrivals)


def test_gamma_burstiness_keeps_the_rate_but_clusters_arrivals() -> None:
    mix = TraceMix(bundled_trace("conv"))

    def gaps_cv(shape: float) -> tuple[int, float]:
        times = [a.time for a in gamma(20.0, shape, 500.0, mix, random.Random(0))]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        mean = sum(gaps) / len(gaps)
        sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
        return len(times), sd / mean

    n1, cv1 = gaps_cv(1.0)
    n2, cv2 = gaps_cv(0.25)
    assert abs(n1 - 10_000) < 600
    assert abs(n2 - 10_000) < 1_200
    assert cv2 > 1.5 * cv1


def test_a_replayed_trace_is_rescaled_to_the_asked_rate() -> None:
    rows = bundled_trace("code")
    arrivals = list(replay(rows, 10.0, 3000.0))
    assert 25_000 < len(arrivals) < 35_000
    assert arrivals[0].prompt_tokens == rows[0].prompt_tokens


def test_the_bundled_traces_ship_with_their_license() -> None:
    from importlib import resources

    folder = resources.files("router.sim") / "traces" / "azure-llm-2023"
    assert "Attribution 4.0 International" in (folder / "LICENSE").read_text(encoding="utf-8")
    assert "Splitwise" in (folder / "README.md").read_text(encoding="utf-8")
    assert len(bundled_trace("conv")) == 19_366


def test_a_bad_trace_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,lots,109\n"
    )
    with pytest.raises(ConfigError, match=r"t.csv:3: row"):
        load_trace(path)
