"""A replica's measured capacity, the theoretical share of a fixed split, and length fits."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest

from router.config import parse_fleet
from router.sim.capacity import capacity_at, measure_capacity, static_split_share
from router.sim.engine import Engine
from router.sim.runner import Workload, simulate, trace_rows
from router.sim.workload import LognormalMix, TraceRow, bundled_trace, load_trace


def toy_cost(prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
    """Weights read once per step (10 ms), plus compute per token and a KV read per context
    token: throughput first grows with the batch, then the KV read takes over."""
    return 0.01 + 2e-5 * (prefill_tokens + decode_seqs) + 2e-7 * decode_context_tokens


def toy_engine(kv: int = 60_000, max_num_seqs: int = 256) -> Engine:
    return Engine(toy_cost, kv_capacity_tokens=kv, max_num_seqs=max_num_seqs)


MIX = LognormalMix((400, 500), (80, 100))


def test_capacity_is_the_best_throughput_over_the_concurrencies_a_router_can_hold() -> None:
    best = measure_capacity(toy_engine, MIX)
    tried = [capacity_at(toy_engine, MIX, n) for n in (1, 8, 32, 64, 100, 128, 256)]
    assert best >= max(tried)
    assert best > tried[0]


def test_a_small_kv_cache_caps_what_more_concurrency_can_add() -> None:
    """Past what the cache holds, more requests only wait inside the engine."""
    small = partial(toy_engine, kv=6_000)
    fits = 6_000 // 600
    held = capacity_at(small, MIX, fits)
    flooded = capacity_at(small, MIX, 256)
    assert flooded <= 1.05 * held
    assert measure_capacity(small, MIX) < measure_capacity(toy_engine, MIX)


def test_capacity_at_refuses_a_concurrency_below_one() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        capacity_at(toy_engine, MIX, 0)


def test_round_robins_share_is_n_times_the_weakest_over_the_total() -> None:
    capacities = {"a0": 8.0, "a1": 8.0, "v0": 3.0, "v1": 3.0}
    uniform = dict.fromkeys(capacities, 1.0)
    assert static_split_share(capacities, uniform) == pytest.approx(4 * 3.0 / 22.0)


def test_weights_matching_capacity_reach_all_of_it_and_wrong_ones_less() -> None:
    capacities = {"a0": 8.0, "a1": 8.0, "v0": 3.0, "v1": 3.0}
    assert static_split_share(capacities, capacities) == pytest.approx(1.0)
    # Weights 2:1 against capacities 8:3 send the V100s too much: they saturate first.
    two_to_one = {"a0": 2.0, "a1": 2.0, "v0": 1.0, "v1": 1.0}
    assert static_split_share(capacities, two_to_one) == pytest.approx(3.0 * 6.0 / 22.0)


def test_a_replica_with_no_share_does_not_limit_the_split() -> None:
    capacities = {"a": 8.0, "b": 0.5}
    assert static_split_share(capacities, {"a": 1.0, "b": 0.0}) == pytest.approx(8.0 / 8.5)
    with pytest.raises(ValueError, match="more than 0"):
        static_split_share(capacities, {"a": 0.0, "b": 0.0})


def test_a_lognormal_fit_keeps_the_traces_median_and_mean() -> None:
    rows = bundled_trace("conv")
    fit = LognormalMix.fit(rows)
    assert fit.mean_prompt == pytest.approx(sum(r.prompt_tokens for r in rows) / len(rows))
    assert fit.mean_output == pytest.approx(sum(r.output_tokens for r in rows) / len(rows))
    rng = random.Random(0)
    drawn = sorted(fit.sample(rng)[0] for _ in range(20_001))
    prompts = sorted(r.prompt_tokens for r in rows)
    assert drawn[10_000] == pytest.approx(prompts[len(prompts) // 2], rel=0.05)
    assert sum(drawn) / len(drawn) == pytest.approx(fit.mean_prompt, rel=0.05)


def test_a_sample_skewed_left_gets_the_nearest_lognormal() -> None:
    rows = [TraceRow(float(i), p, 10) for i, p in enumerate((1, 100, 100))]
    fit = LognormalMix.fit(rows)  # mean 67 < median 100: sigma 0, every draw the median
    assert {fit.sample(random.Random(s))[0] for s in range(5)} == {100}


def test_lengths_can_come_from_the_trace_or_its_lognormal_fit_but_not_both_with_its_timing() -> (
    None
):
    rows = trace_rows("code")
    assert isinstance(Workload(rows, lengths="lognormal").mix, LognormalMix)
    with pytest.raises(ValueError, match="its own lengths"):
        Workload(rows, "trace", lengths="lognormal")
    with pytest.raises(ValueError, match="burstiness"):
        Workload(rows, "gamma", 0.0)


def test_a_request_larger_than_a_replicas_kv_cache_is_rejected_not_held_forever(
    tmp_path: Path,
) -> None:
    """A fleet file that gives no KV capacity: the simulator tells the router the engine's,
    so a 50k-token prompt for an L4 (about 43k tokens of cache) is rejected, as vLLM would
    refuse it, and the rest are served."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0,50000,100\n"
        "2023-11-16 18:15:47.0,500,100\n"
        "2023-11-16 18:15:48.0,700,50\n"
    )
    fleet = parse_fleet(L4_FLEET, "l4.yaml")
    workload = Workload(load_trace(trace))
    run = simulate(fleet, "round-robin", workload, 1.0, 20.0, 0, {"l4": 1.0})
    assert run.result.rejected > 0
    assert run.result.completed > 0
    assert run.result.unfinished == 0
    assert run.result.lost_requests == 0


L4_FLEET = """\
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: n0
    gpus: [{index: 0, model: L4, memory_gib: 24}]
    replicas:
      - {id: l4, endpoint: "http://127.0.0.1:18001", gpus: [0]}
"""
