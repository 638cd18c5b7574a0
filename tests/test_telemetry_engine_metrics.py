"""Engine /metrics normalised over vLLM (current and deprecated names), SGLang and TGI."""

from __future__ import annotations

import dataclasses

import pytest

from router.clock import ManualClock
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.replica import EngineLoad
from router.request import Request
from router.strategies.capacity_aware import CapacityAware
from router.telemetry.engine_metrics import (
    EngineMetricsError,
    EngineMetricsPoller,
    parse_engine_metrics,
)
from tests.telemetry_helpers import fleet

VLLM_TWO_ENGINES = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 10.0
vllm:num_requests_running{engine="1",model_name="m"} 12.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0
"""

VLLM_OLD = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 5.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.25
"""

SGLANG = """\
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 6
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 9
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.42
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 8
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
"""


@pytest.mark.parametrize(
    ("page", "engine", "waiting", "running", "kv"),
    [
        (VLLM_TWO_ENGINES, "vllm", 7, 22, 0.6),
        (VLLM_OLD, "vllm-deprecated", 2, 5, 0.25),
        (SGLANG, "sglang", 6, 9, 0.42),
        (TGI, "tgi", 8, 16, None),
    ],
)
def test_each_engine_is_normalised_to_one_signal(
    page: str, engine: str, waiting: int, running: int, kv: float | None
) -> None:
    """Queues summed over engines, KV usage averaged, whatever the names."""
    reading = parse_engine_metrics(page)
    assert (reading.engine, reading.waiting, reading.running) == (engine, waiting, running)
    assert reading.kv_usage == pytest.approx(kv) if kv is not None else reading.kv_usage is None


def test_the_current_vllm_kv_name_wins_over_the_deprecated_one() -> None:
    both = VLLM_OLD.replace("0.25", "0.9") + VLLM_TWO_ENGINES.split("# TYPE vllm:prompt")[0]
    reading = parse_engine_metrics(both.replace("# TYPE vllm:num_requests_waiting gauge\n", ""))
    assert reading.engine == "vllm"
    assert reading.kv_usage == pytest.approx(0.6)


@pytest.mark.parametrize("page", ["", "# TYPE foo gauge\nfoo 1\n", "not { prometheus"])
def test_a_page_without_known_names_is_an_error(page: str) -> None:
    with pytest.raises(EngineMetricsError):
        parse_engine_metrics(page)


async def test_the_poller_reads_the_emulator_and_unreachable_replicas_keep_an_error() -> None:
    """Against the replica emulator's real /metrics: engine load with the router's clock."""
    config = fleet()
    emulated = EmulatedFleet(config, replicas=["h100-0"], ports={"h100-0": 0})
    async with emulated:
        endpoints = {"h100-0": emulated.url("h100-0")}
        replicas = tuple(
            dataclasses.replace(r, endpoint=endpoints.get(r.id, "http://127.0.0.1:9"))
            for r in config.replicas
        )
        nodes = tuple(
            dataclasses.replace(n, replicas=tuple(r for r in replicas if r.node == n.name))
            for n in config.nodes
        )
        core = RouterCore(dataclasses.replace(config, nodes=nodes))
        poller = EngineMetricsPoller(core, timeout_s=2.0)
        try:
            await poller.poll_once()
        finally:
            await poller.stop()
    engine = core.replica("h100-0").engine
    assert engine is not None
    assert (engine.engine, engine.waiting, engine.running, engine.kv_usage) == ("vllm", 0, 0, 0.0)
    assert core.replica("a100-0").engine is None
    assert "a100-0" in poller.errors
    assert "h100-0" not in poller.errors


def test_capacity_aware_takes_kv_usage_from_fresh_engine_metrics_only() -> None:
    """A full KV cache (engine says 99%) keeps work away until the reading goes stale."""
    clock = ManualClock(10.0)
    core = RouterCore(fleet(), clock=clock)
    core.set_strategy("capacity-aware", {"stale_after_s": 3.0})
    strategy = core.strategy
    assert isinstance(strategy, CapacityAware)
    h100 = core.replica("h100-0")
    h100.engine = EngineLoad("vllm", received_at=clock.now, kv_usage=0.99)
    free, source = strategy.free_tokens(h100, clock.now)
    assert source == "engine telemetry"
    assert free == pytest.approx(0.01 * 450_000)
    big = Request("big", 6000, 100, clock.now)
    core.submit(big)
    assert big.id not in h100.running  # placed elsewhere: h100-0 has no room for it
    clock.advance(3.0)
    assert strategy.free_tokens(h100, clock.now) == (450_000, "router accounting")
