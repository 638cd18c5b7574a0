"""The emulated replica's vLLM metrics count what its engine did: requests by finish reason,
each request's phases, inter-token latency per generated token, the waiting queue by reason."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.emulator import EmulatedFleet
from router.emulator.exposition import Page, label_text
from router.emulator.histogram import WeightedHistogram, one_two_five
from tests.test_emulator_support import (
    MODEL,
    TIME_SCALE,
    Spec,
    any_ports,
    completion,
    fleet_config,
    metric,
    scrape,
    until,
)

SPECS = (Spec("a"),)


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    emulated = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as c:
        yield c


def _value(text: str, name: str, **extra: str) -> float:
    """The sample of ``name`` with the replica's labels and ``extra`` (written sorted)."""
    labels = {"engine": "0", "model_name": MODEL, **extra}
    written = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return metric(text, f"{name}{{{written}}}")


async def test_finished_requests_are_counted_by_reason_with_their_phases(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    base = fleet.url("a") + "/v1/completions"
    await client.post(base, json=completion(300, 20, max_tokens=20))  # stops at its limit
    await client.post(base, json=completion(100, 5, max_tokens=9))  # the "model" stops it
    text = await scrape(client, fleet.url("a"))
    success = "vllm:request_success_total"
    assert _value(text, success, finished_reason="length") == 1
    assert _value(text, success, finished_reason="stop") == 1
    assert _value(text, success, finished_reason="abort") == 0
    # The first token comes out of the prefill; every later one is one decode step.
    assert _value(text, "vllm:inter_token_latency_seconds_count") == 19 + 4
    assert _value(text, "vllm:request_time_per_output_token_seconds_count") == 2
    assert _value(text, "vllm:request_generation_tokens_sum") == 25
    assert _value(text, "vllm:request_prompt_tokens_sum") == 400
    assert _value(text, "vllm:request_params_max_tokens_sum") == 29
    assert _value(text, "vllm:iteration_tokens_total_sum") == 400 + 23
    e2e = _value(text, "vllm:e2e_request_latency_seconds_sum")
    queued = _value(text, "vllm:request_queue_time_seconds_sum")
    inference = _value(text, "vllm:request_inference_time_seconds_sum")
    prefill = _value(text, "vllm:request_prefill_time_seconds_sum")
    decode = _value(text, "vllm:request_decode_time_seconds_sum")
    assert e2e == pytest.approx(queued + inference)
    assert inference == pytest.approx(prefill + decode)
    assert prefill > 0
    assert decode > 0


async def test_a_request_given_up_mid_stream_is_an_abort(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    replica = fleet.replica("a")
    body = completion(10, 4000, max_tokens=4000, stream=True)
    async with client.stream("POST", fleet.url("a") + "/v1/completions", json=body) as r:
        async for _ in r.aiter_bytes():
            break  # one chunk, then hang up
    await until(lambda: replica.driver.in_flight == 0)
    text = await scrape(client, fleet.url("a"))
    assert _value(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(text, "vllm:request_success_total", finished_reason="length") == 0


async def test_requests_held_back_wait_for_capacity_never_deferred(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    await fleet.freeze("a")  # the engine admits nothing: every request waits
    url = fleet.url("a") + "/v1/completions"
    held = [asyncio.create_task(client.post(url, json=completion(10, 2))) for _ in range(3)]
    replica = fleet.replica("a")
    await until(lambda: len(replica.engine.waiting) == 3)
    text = await scrape(client, fleet.url("a"))
    assert _value(text, "vllm:num_requests_waiting") == 3
    assert _value(text, "vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert _value(text, "vllm:num_requests_waiting_by_reason", reason="deferred") == 0
    await fleet.thaw("a")
    assert [r.status_code for r in await asyncio.gather(*held)] == [200] * 3


def test_a_weighted_observation_counts_n_times_in_its_bucket() -> None:
    histogram = WeightedHistogram((0.1, 0.5, 1.0))
    histogram.observe(0.5, 3)  # on a bound: counts in that bucket (le)
    histogram.observe(2.0)
    assert histogram.count == 4
    assert histogram.total == pytest.approx(3.5)
    assert histogram.cumulative() == [(0.1, 0), (0.5, 3), (1.0, 3), (math.inf, 4)]
    with pytest.raises(ValueError, match="increasing"):
        WeightedHistogram((1.0, 0.5))


def test_token_buckets_run_one_two_five_up_to_the_limit() -> None:
    assert one_two_five(100) == (1, 2, 5, 10, 20, 50, 100)
    assert one_two_five(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


def test_the_page_is_prometheus_text_that_prometheus_client_reads_back() -> None:
    """Written by hand for speed, so read back with the parser the router uses."""
    page = Page()
    page.gauge("g", "a gauge", [(label_text({"model_name": 'a"b\\c'}), 0.5)])
    page.counter("c", "a counter", [('engine="0"', 3)], created=17.0)
    page.histogram("h", "a histogram", 'engine="0"', [(1.0, 2), (math.inf, 5)], 9.5, 17.0)
    families = {f.name: f for f in text_string_to_metric_families(page.render().decode())}
    assert families["g"].samples[0].labels == {"model_name": 'a"b\\c'}
    assert families["c"].type == "counter"
    assert [(s.name, s.value) for s in families["c"].samples] == [("c_total", 3.0)]
    assert families["c_created"].samples[0].value == 17.0
    histogram = {(s.name, s.labels.get("le")): s.value for s in families["h"].samples}
    assert histogram == {
        ("h_bucket", "1.0"): 2.0,
        ("h_bucket", "+Inf"): 5.0,
        ("h_count", None): 5.0,
        ("h_sum", None): 9.5,
    }
