"""Engine /metrics normalised over vLLM (current and deprecated names), SGLang and TGI: load,
KV-cache size and preemptions. Nonsense values: tests/test_engine_metrics_values.py."""

from __future__ import annotations

import dataclasses

import pytest

from router.clock import ManualClock
from router.config.schema import FleetConfig
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.replica import EngineLoad, Replica
from router.request import Request
from router.strategies.capacity_aware import CapacityAware
from router.telemetry.engine_metrics import (
    EngineMetricsError,
    EngineMetricsPoller,
    EngineReading,
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


def test_a_line_the_poller_does_not_read_cannot_make_the_page_unreadable() -> None:
    """Only the wanted names are parsed (a vLLM page is mostly histograms): a broken line of
    another family leaves the reading whole, and a broken wanted line still fails the page."""
    broken = 'vllm:time_to_first_token_seconds_bucket{le="0.1" 3\n'
    reading = parse_engine_metrics(VLLM_TWO_ENGINES + broken)
    assert (reading.waiting, reading.running) == (7, 22)
    with pytest.raises(EngineMetricsError, match="not Prometheus text"):
        parse_engine_metrics(VLLM_TWO_ENGINES + 'vllm:num_requests_running{engine="2" 3\n')
    # A longer name that starts with a wanted one is another family, not read.
    longer = 'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 50.0\n'
    assert parse_engine_metrics(VLLM_TWO_ENGINES + longer).waiting == 7


async def _poll_once(
    config: FleetConfig, endpoints: dict[str, str], *, others: bool = True
) -> EngineMetricsPoller:
    """One poll by a router over ``config``'s replicas at ``endpoints``; the poller, stopped,
    with its core. The other replicas point at a port nothing listens on, or with
    ``others=False`` are left out of the fleet."""
    replicas = tuple(
        dataclasses.replace(r, endpoint=endpoints.get(r.id, "http://127.0.0.1:9"))
        for r in config.replicas
        if others or r.id in endpoints
    )
    nodes = tuple(
        dataclasses.replace(n, replicas=tuple(r for r in replicas if r.node == n.name))
        for n in config.nodes
    )
    poller = EngineMetricsPoller(
        RouterCore(dataclasses.replace(config, nodes=nodes)), timeout_s=2.0
    )
    try:
        await poller.poll_once()
    finally:
        await poller.stop()
    return poller


async def test_the_poller_reads_the_emulator_and_unreachable_replicas_keep_an_error() -> None:
    """Against the replica emulator's real /metrics: engine load with the router's clock."""
    config = fleet()
    emulated = EmulatedFleet(config, replicas=["h100-0"], ports={"h100-0": 0})
    async with emulated:
        poller = await _poll_once(config, {"h100-0": emulated.url("h100-0")})
    core = poller.core
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


# Pages as the engines write them. vLLM and SGLang serve /metrics through prometheus-client's
# multiprocess collector, which sorts labels; vLLM's cache_config_info carries every
# CacheConfig field as a string (vllm/config/cache.py, metrics_info), one sample per engine.
VLLM_CACHE_FIELDS = (
    'block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",'
    'enable_prefix_caching="True",engine="{engine}",gpu_memory_utilization="0.9",'
    'is_attention_free="False",kv_cache_max_concurrency="27.9375",'
    'kv_cache_memory_bytes="None",kv_cache_size_tokens="57216",kv_offloading_backend="native",'
    'kv_offloading_size="None",mamba_cache_dtype="auto",num_cpu_blocks="None",'
    'num_gpu_blocks="3576",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",'
    'sliding_window="None"'
)
VLLM_DATA_PARALLEL = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 3.0
vllm:num_requests_running{{engine="1",model_name="m"}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} 0.0
vllm:num_requests_waiting{{engine="1",model_name="m"}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} 0.125
vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.375
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} 17.0
vllm:num_preemptions_total{{engine="1",model_name="m"}} 4.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{VLLM_CACHE_FIELDS.format(engine="0")}}} 1.0
vllm:cache_config_info{{{VLLM_CACHE_FIELDS.format(engine="1")}}} 1.0
"""

VLLM_HYBRID = (
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="528",engine="0",kv_cache_size_tokens="211200",'
    'num_gpu_blocks="1200"} 1.0\n'
)
"""A hybrid model (attention and Mamba groups): the engine's token figure is a third of blocks
times block size, and it is the one that holds."""

VLLM_BEFORE_KV_SIZE_LABEL = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions{engine="0",model_name="m"} 9.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0
"""
"""An older vLLM: no kv_cache_size_tokens label (blocks times block size), the deprecated KV
usage name, and a preemption counter without ``_total`` (as an untyped exporter writes it)."""

VLLM_NOT_SIZED_YET = (
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="None",'
    'num_gpu_blocks="None"} 1.0\n'
)
"""An engine that has not sized its cache yet writes ``None``: it does not say, which is not
nonsense."""

SGLANG_RANK = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
SGLANG_DATA_PARALLEL = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{dp_rank="0",{SGLANG_RANK}}} 7.0
sglang:num_running_reqs{{dp_rank="1",{SGLANG_RANK}}} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{dp_rank="0",{SGLANG_RANK}}} 2.0
sglang:num_queue_reqs{{dp_rank="1",{SGLANG_RANK}}} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{dp_rank="0",{SGLANG_RANK}}} 0.31
sglang:token_usage{{dp_rank="1",{SGLANG_RANK}}} 0.29
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{dp_rank="0",{SGLANG_RANK}}} 412352.0
sglang:max_total_num_tokens{{dp_rank="1",{SGLANG_RANK}}} 412352.0
# HELP sglang:num_retracted_reqs The number of retracted requests.
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{{dp_rank="0",{SGLANG_RANK}}} 3.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{{dp_rank="0",{SGLANG_RANK}}} 41.0
sglang:num_retracted_requests_total{{dp_rank="1",{SGLANG_RANK}}} 12.0
"""

TGI_WITH_BUDGET = """\
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 4
# TYPE tgi_queue_size gauge
tgi_queue_size 1
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 161504
"""


@pytest.mark.parametrize(
    ("page", "capacity", "preemptions"),
    [
        pytest.param(VLLM_DATA_PARALLEL, 2 * 57216, 21, id="vllm-data-parallel"),
        pytest.param(VLLM_HYBRID, 211200, None, id="vllm-hybrid"),
        pytest.param(VLLM_BEFORE_KV_SIZE_LABEL, 2048 * 16, 9, id="vllm-older"),
        pytest.param(VLLM_NOT_SIZED_YET, None, None, id="vllm-not-sized-yet"),
        pytest.param(SGLANG_DATA_PARALLEL, 2 * 412352, 53, id="sglang-data-parallel"),
        pytest.param(TGI_WITH_BUDGET, 161504, None, id="tgi"),
        pytest.param(TGI, None, None, id="tgi-without-budget"),
    ],
)
def test_each_engine_s_kv_size_and_preemptions_are_read_and_summed_over_engines(
    page: str, capacity: int | None, preemptions: int | None
) -> None:
    """KV tokens and the preemption counter, summed over a data-parallel server's engines;
    None where the engine does not say (and then nothing is rejected)."""
    reading = parse_engine_metrics(page)
    assert (reading.kv_capacity_tokens, reading.preemptions_total) == (capacity, preemptions)
    assert reading.rejected == {}


def test_a_data_parallel_vllm_page_reads_whole() -> None:
    reading = parse_engine_metrics(VLLM_DATA_PARALLEL)
    assert (reading.engine, reading.waiting, reading.running) == ("vllm", 1, 5)
    assert reading.kv_usage == pytest.approx(0.25)


def test_sglang_s_last_batch_retraction_gauge_is_not_taken_for_the_counter() -> None:
    """``sglang:num_retracted_reqs`` is a gauge (the last batch); only the ``_total`` counter
    counts preemptions."""
    gauge_only = "\n".join(
        line
        for line in SGLANG_DATA_PARALLEL.splitlines()
        if "num_retracted_requests_total" not in line
    )
    assert parse_engine_metrics(gauge_only + "\n").preemptions_total is None


def test_ranks_of_one_engine_that_repeat_its_kv_size_count_once() -> None:
    """Tensor-parallel ranks of one SGLang engine repeating its pool size are one pool."""
    page = (
        "# TYPE sglang:max_total_num_tokens gauge\n"
        'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 5000.0\n'
        'sglang:max_total_num_tokens{model_name="m",tp_rank="1"} 5000.0\n'
    )
    assert parse_engine_metrics(page).kv_capacity_tokens == 5000


async def test_the_poller_reads_the_emulator_s_true_kv_capacity_and_preemptions() -> None:
    """Over loopback: the emulator's /metrics, read by our own poller, gives the emulated
    engine's own KV capacity and preemption count."""
    config = fleet()
    emulated = EmulatedFleet(config, replicas=["h100-0"], ports={"h100-0": 0})
    async with emulated:
        engine = emulated.replica("h100-0").engine
        engine.preemptions = 7  # as if the engine had preempted seven sequences
        poller = await _poll_once(config, {"h100-0": emulated.url("h100-0")}, others=False)
    load = poller.core.replica("h100-0").engine
    assert load is not None
    assert (load.kv_capacity_tokens, load.preemptions_total) == (engine.kv_capacity, 7)
    assert poller.errors == {}
    assert poller.rejected == {}


def test_a_changed_reading_tells_the_pool_and_an_unchanged_one_does_not() -> None:
    """Strategies that index on engine state hear of a new reading, not of every poll."""
    clock = ManualClock(1.0)
    core = RouterCore(fleet(), clock=clock)
    poller = EngineMetricsPoller(core, clock=clock)
    heard: list[str] = []
    strategy_update = core.pool.listener
    assert strategy_update is not None

    def listener(replica: Replica) -> None:
        heard.append(replica.id)
        strategy_update(replica)

    core.pool.listener = listener
    h100 = core.replica("h100-0")
    reading = EngineReading("vllm", waiting=0, running=3, kv_usage=0.5, kv_capacity_tokens=4096)
    assert poller.apply(h100, reading)
    clock.advance(2.0)
    assert not poller.apply(h100, reading)  # only the time stamp moved
    assert h100.engine is not None
    assert h100.engine.received_at == 3.0
    assert poller.apply(h100, dataclasses.replace(reading, waiting=4))
    assert heard == ["h100-0", "h100-0"]
