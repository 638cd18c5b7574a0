"""Nonsense on an engine's /metrics (negative, NaN, infinite, absurdly large) never reaches the
router as a reading: the field keeps its last good value, the refusal is counted per replica,
and the rest of the page still counts."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.replica import EngineLoad
from router.telemetry.engine_metrics import (
    MAX_ENGINE_REQUESTS,
    MAX_KV_CAPACITY_TOKENS,
    MAX_KV_USAGE,
    MAX_PREEMPTIONS,
    MIN_KV_CAPACITY_TOKENS,
    EngineMetricsPoller,
    EngineReading,
    parse_engine_metrics,
)
from tests.telemetry_helpers import fleet

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=300)


def vllm_page(
    *,
    waiting: float = 2.0,
    running: float = 5.0,
    kv: float = 0.5,
    blocks: str = "1024",
    preemptions: float = 3.0,
    sane_engines: int = 0,
) -> str:
    """A vLLM page with the given values (Python's float repr: nan, inf, 1e+30) for engine 0,
    and ``sane_engines`` more engines of a data-parallel server with the default values."""
    families = [
        ("vllm:num_requests_waiting", "gauge", "{labels} {v!r}", waiting, 2.0),
        ("vllm:num_requests_running", "gauge", "{labels} {v!r}", running, 5.0),
        ("vllm:kv_cache_usage_perc", "gauge", "{labels} {v!r}", kv, 0.5),
        ("vllm:num_preemptions_total", "counter", "{labels} {v!r}", preemptions, 3.0),
        (
            "vllm:cache_config_info",
            "gauge",
            '{{block_size="16",engine="{engine}",num_gpu_blocks="{v}"}} 1.0',
            blocks,
            "1024",
        ),
    ]
    lines = []
    for name, kind, sample, first, sane in families:
        lines.append(f"# TYPE {name} {kind}")
        for engine in range(1 + sane_engines):
            labels = f'{{engine="{engine}",model_name="m"}}'
            value = first if engine == 0 else sane
            lines.append(name + sample.format(labels=labels, engine=engine, v=value))
    return "\n".join(lines) + "\n"


GOOD_READING = parse_engine_metrics(vllm_page())


def test_a_sane_page_has_nothing_rejected() -> None:
    reading = parse_engine_metrics(vllm_page())
    assert reading == EngineReading(
        "vllm",
        waiting=2,
        running=5,
        kv_usage=0.5,
        kv_capacity_tokens=1024 * 16,
        preemptions_total=3,
        rejected={},
    )


NONSENSE = [
    pytest.param("kv_usage", {"kv": 7.0}, id="kv-usage-7"),
    pytest.param("kv_usage", {"kv": -1.0}, id="kv-usage-negative"),
    pytest.param("kv_usage", {"kv": 1.0001}, id="kv-usage-just-over-1-is-not-clamped"),
    pytest.param("kv_usage", {"kv": math.nan}, id="kv-usage-nan"),
    pytest.param("waiting", {"waiting": 1e30}, id="waiting-1e30"),
    pytest.param("waiting", {"waiting": -1.0}, id="waiting-negative"),
    pytest.param("running", {"running": math.inf}, id="running-inf"),
    pytest.param("kv_capacity_tokens", {"blocks": "0"}, id="kv-capacity-0"),
    pytest.param("kv_capacity_tokens", {"blocks": "62500000000000"}, id="kv-capacity-1e15"),
    pytest.param("kv_capacity_tokens", {"blocks": "-4"}, id="kv-capacity-negative"),
    pytest.param("kv_capacity_tokens", {"blocks": "lots"}, id="kv-capacity-not-a-number"),
    pytest.param("preemptions_total", {"preemptions": -1.0}, id="preemptions-negative"),
    pytest.param("preemptions_total", {"preemptions": -math.inf}, id="preemptions-minus-inf"),
    pytest.param("preemptions_total", {"preemptions": 1e30}, id="preemptions-1e30"),
]


@pytest.mark.parametrize(("field", "values"), NONSENSE)
def test_a_nonsense_value_is_rejected_and_the_rest_of_the_page_still_counts(
    field: str, values: dict[str, Any]
) -> None:
    reading = parse_engine_metrics(vllm_page(**values))
    assert getattr(reading, field) is None
    assert set(reading.rejected) == {field}
    others = ("waiting", "running", "kv_usage", "kv_capacity_tokens", "preemptions_total")
    for other in others:
        if other != field:
            assert getattr(reading, other) == getattr(GOOD_READING, other)


def test_one_nonsense_engine_of_a_data_parallel_server_rejects_the_sum() -> None:
    """Engine 1's -5 would hide inside a plausible-looking sum: the whole figure is refused."""
    page = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 8.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} -5.0\n'
    )
    reading = parse_engine_metrics(page)
    assert reading.waiting is None
    assert "waiting" in reading.rejected


def test_the_kv_size_of_a_sglang_or_tgi_page_is_bounded_too() -> None:
    sglang = parse_engine_metrics(
        "# TYPE sglang:max_total_num_tokens gauge\n"
        'sglang:max_total_num_tokens{model_name="m"} 1e15\n'
    )
    tgi = parse_engine_metrics(
        "# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens 0\n"
    )
    assert (sglang.engine, sglang.kv_capacity_tokens) == ("sglang", None)
    assert (tgi.engine, tgi.kv_capacity_tokens) == ("tgi", None)
    assert set(sglang.rejected) == set(tgi.rejected) == {"kv_capacity_tokens"}


def test_the_poller_keeps_the_last_good_value_and_counts_each_refusal() -> None:
    clock = ManualClock(1.0)
    core = RouterCore(fleet(), clock=clock)
    poller = EngineMetricsPoller(core, clock=clock)
    h100 = core.replica("h100-0")
    poller.apply(h100, GOOD_READING)
    clock.advance(1.0)
    poller.apply(h100, parse_engine_metrics(vllm_page(kv=7.0, blocks="0", waiting=9.0)))
    load = h100.engine
    assert load is not None
    assert (load.kv_usage, load.kv_capacity_tokens) == (0.5, 1024 * 16)  # last good values
    assert (load.waiting, load.received_at) == (9, 2.0)  # the rest of the page counts
    assert poller.rejected == {"h100-0": 2}
    assert "kv_usage: 7.0" in poller.last_rejection["h100-0"]
    assert "kv_capacity_tokens" in poller.last_rejection["h100-0"]
    poller.apply(h100, parse_engine_metrics(vllm_page(running=-1.0)))
    assert poller.rejected == {"h100-0": 3}
    assert h100.engine is not None
    assert h100.engine.running == 5
    assert "a100-0" not in poller.rejected
    assert poller.status().refusing == ("h100-0",)
    poller.apply(h100, GOOD_READING)
    # A sane page ends the trouble now; the count since start stays.
    assert (poller.status().refusing, poller.status().rejected) == ((), {"h100-0": 3})


def test_a_field_refused_on_the_first_page_stays_unknown() -> None:
    core = RouterCore(fleet())
    poller = EngineMetricsPoller(core)
    h100 = core.replica("h100-0")
    poller.apply(h100, parse_engine_metrics(vllm_page(kv=math.nan)))
    assert h100.engine is not None
    assert h100.engine.kv_usage is None
    assert h100.engine.waiting == 2


def test_a_preemption_counter_that_goes_backwards_is_a_restart_not_nonsense() -> None:
    """A restarted engine counts from zero again: the lower figure is the new baseline."""
    core = RouterCore(fleet())
    poller = EngineMetricsPoller(core)
    h100 = core.replica("h100-0")
    poller.apply(h100, parse_engine_metrics(vllm_page(preemptions=40.0)))
    poller.apply(h100, parse_engine_metrics(vllm_page(preemptions=2.0)))
    assert h100.engine is not None
    assert h100.engine.preemptions_total == 2
    assert poller.rejected == {}


def within_bounds(load: EngineLoad | EngineReading) -> bool:
    checks = [
        (load.waiting, 0, MAX_ENGINE_REQUESTS),
        (load.running, 0, MAX_ENGINE_REQUESTS),
        (load.kv_usage, 0.0, MAX_KV_USAGE),
        (load.kv_capacity_tokens, MIN_KV_CAPACITY_TOKENS, MAX_KV_CAPACITY_TOKENS),
        (load.preemptions_total, 0, MAX_PREEMPTIONS),
    ]
    return all(value is None or low <= value <= high for value, low, high in checks)


garbage = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-1.0, 0.0, 1.0, 7.0, 1e15, 1e30, -1e30, 2.0**53, 2.0**53 + 2]),
)
block_labels = st.one_of(
    st.integers(min_value=-(10**16), max_value=10**16).map(str),
    st.sampled_from(["None", "", "0", "1", "abc", "1.5", "-0", "1e3"]),
)


@FUZZ
@given(
    waiting=garbage,
    running=garbage,
    kv=garbage,
    blocks=block_labels,
    preemptions=garbage,
    data_parallel=st.booleans(),
)
def test_no_page_of_garbage_makes_a_reading_outside_its_bounds(
    waiting: float,
    running: float,
    kv: float,
    blocks: str,
    preemptions: float,
    data_parallel: bool,
) -> None:
    """Whatever the values, each field is in its bounds or refused; through the poller, a
    refused field holds exactly the last good value."""
    page = vllm_page(
        waiting=waiting,
        running=running,
        kv=kv,
        blocks=blocks,
        preemptions=preemptions,
        sane_engines=int(data_parallel),
    )
    reading = parse_engine_metrics(page)
    assert within_bounds(reading)
    assert all(getattr(reading, name) is None for name in reading.rejected)
    core = RouterCore(fleet())
    poller = EngineMetricsPoller(core)
    h100 = core.replica("h100-0")
    poller.apply(h100, GOOD_READING)
    poller.apply(h100, reading)
    load = h100.engine
    assert load is not None
    assert within_bounds(load)
    for name in reading.rejected:
        assert getattr(load, name) == getattr(GOOD_READING, name)
    assert poller.rejected.get("h100-0", 0) == len(reading.rejected)


def test_a_nonsense_kv_size_leaves_the_learned_capacity_at_its_last_good_value() -> None:
    """The learned KV size follows the engine's figure, ignores a nonsense one, and the
    refusal is counted in /metrics."""
    from router.http.metrics import RouterMetrics

    clock = ManualClock(1.0)
    core = RouterCore(fleet(), clock=clock)
    poller = EngineMetricsPoller(core, clock=clock)
    metrics = RouterMetrics(core, engine_rejected=lambda: poller.rejected)
    h100 = core.replica("h100-0")
    poller.apply(h100, GOOD_READING)
    core.refresh_capacity()
    assert h100.kv_tokens == 1024 * 16
    clock.advance(1.0)
    poller.apply(h100, parse_engine_metrics(vllm_page(blocks="-5")))
    core.refresh_capacity()
    assert h100.kv_tokens == 1024 * 16
    assert core.capacity.estimate(h100, clock()).kv_source == "engine"
    text = metrics.render().decode()
    assert 'gpurouter_engine_metrics_rejected_values_total{replica="h100-0"} 1.0' in text
    assert poller.status().rejected == {"h100-0": 1}
