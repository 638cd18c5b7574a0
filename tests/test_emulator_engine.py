"""The emulator runs the engine model in real time: timing, KV pressure, cancellation, GPUs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from router.emulator import EmulatedFleet
from router.perf.profiles import default_catalog, load_catalog
from router.telemetry.schema import GpuBatch, decode_gpus, encode
from tests.test_emulator_support import (
    MODEL,
    NODE,
    TIME_SCALE,
    Spec,
    any_ports,
    completion,
    fleet_config,
    metric,
    scrape,
    until,
)

SPECS = (
    Spec("a100"),
    Spec("v100", gpu="V100-32GB"),
    Spec("small", kv_capacity=4096),
    Spec("tp", tp=2),
)
LABEL = f'{{engine="0",model_name="{MODEL}"}}'


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    emulated = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as c:
        yield c


async def _first_token_wall_s(client: httpx.AsyncClient, url: str, prompt_tokens: int) -> float:
    body = completion(prompt_tokens, 2, max_tokens=2, stream=True)
    start = time.monotonic()
    async with client.stream("POST", url, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                return time.monotonic() - start
    raise AssertionError("no token came")


async def test_a_longer_prompt_gets_its_first_token_later_on_an_idle_replica(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    base = fleet.url("a100")
    url = base + "/v1/completions"
    short_wall = await _first_token_wall_s(client, url, 100)
    short_ttft = metric(await scrape(client, base), "vllm:time_to_first_token_seconds_sum" + LABEL)
    long_wall = await _first_token_wall_s(client, url, 30_000)
    total = metric(await scrape(client, base), "vllm:time_to_first_token_seconds_sum" + LABEL)
    assert total - short_ttft > 10 * short_ttft
    assert long_wall > short_wall


async def test_an_a100_answers_the_same_request_sooner_than_a_v100(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    body = completion(1000, 100, max_tokens=100)
    requests = {
        asyncio.create_task(client.post(fleet.url(rid) + "/v1/completions", json=body)): rid
        for rid in ("a100", "v100")
    }
    done, pending = await asyncio.wait(requests, return_when=asyncio.FIRST_COMPLETED)
    assert [requests[t] for t in done] == ["a100"]
    await asyncio.gather(*pending)
    name = "vllm:e2e_request_latency_seconds_sum" + LABEL
    e2e = {rid: metric(await scrape(client, fleet.url(rid)), name) for rid in ("a100", "v100")}
    assert e2e["v100"] > 1.5 * e2e["a100"]


async def test_kv_pressure_makes_requests_wait(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    """Four requests of 1,500 tokens on a 4,096-token cache: two run, two wait."""
    replica = fleet.replica("small")
    engine = replica.engine
    await fleet.slow("small", 30.0)  # decode steps of ~3 ms of wall time: the state holds
    url = fleet.url("small") + "/v1/completions"
    body = completion(1500, 20, max_tokens=20)
    tasks = [asyncio.create_task(client.post(url, json=body)) for _ in range(4)]
    await until(lambda: len(engine.waiting) == 2 and engine.kv_used > 0)
    # Rendered at once, in step with the condition; the HTTP route serves this same text.
    text = replica.metrics.render().decode()
    assert metric(text, "vllm:num_requests_running" + LABEL) == 2
    assert metric(text, "vllm:num_requests_waiting" + LABEL) == 2
    assert 0.7 < metric(text, "vllm:kv_cache_usage_perc" + LABEL) <= 1
    await fleet.heal("small")
    responses = await asyncio.gather(*tasks)
    assert [r.status_code for r in responses] == [200] * 4
    text = await scrape(client, fleet.url("small"))
    assert metric(text, "vllm:e2e_request_latency_seconds_count" + LABEL) == 4


async def test_a_client_that_disconnects_mid_stream_cancels_its_sequence(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    """A 100,000-token answer (over 10 s here) is dropped as soon as its reader goes."""
    replica = fleet.replica("a100")
    body = completion(100, 100_000, max_tokens=100_000, stream=True)
    async with client.stream("POST", fleet.url("a100") + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                break
        assert replica.driver.in_flight == 1
    await asyncio.wait_for(replica.driver.wait_idle(), 2.0)
    assert replica.engine.idle
    assert replica.driver.in_flight == 0


async def test_a_client_that_times_out_cancels_its_queued_request(fleet: EmulatedFleet) -> None:
    replica = fleet.replica("a100")
    await fleet.slow("a100", 1000.0)
    async with httpx.AsyncClient(timeout=0.2) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await impatient.post(
                fleet.url("a100") + "/v1/completions", json=completion(100, 50, max_tokens=50)
            )
    await fleet.heal("a100")
    await asyncio.wait_for(replica.driver.wait_idle(), 2.0)
    assert replica.driver.in_flight == 0


async def test_slow_multiplies_every_step_time(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    """The same request on an idle replica costs 3x the engine time once slowed by 3."""
    replica = fleet.replica("a100")
    url = fleet.url("a100") + "/v1/completions"
    body = completion(500, 30, max_tokens=30)
    before = replica.engine.busy_seconds
    await client.post(url, json=body)
    normal = replica.engine.busy_seconds - before
    ttft_normal = metric(
        await scrape(client, fleet.url("a100")), "vllm:time_to_first_token_seconds_sum" + LABEL
    )
    await fleet.slow("a100", 3.0)
    before = replica.engine.busy_seconds
    await client.post(url, json=body)
    slowed = replica.engine.busy_seconds - before
    ttft_total = metric(
        await scrape(client, fleet.url("a100")), "vllm:time_to_first_token_seconds_sum" + LABEL
    )
    assert slowed == pytest.approx(3 * normal, rel=1e-9)
    assert ttft_total - ttft_normal == pytest.approx(3 * ttft_normal, rel=1e-6)


async def test_gpu_samples_read_like_nvml_and_survive_the_telemetry_codec(
    fleet: EmulatedFleet, client: httpx.AsyncClient
) -> None:
    fleet.gpu_samples(NODE)  # start a fresh window
    await client.post(fleet.url("a100") + "/v1/completions", json=completion(2000, 50))
    samples = {s.replica: s for s in fleet.gpu_samples(NODE)}
    catalog = default_catalog()
    for sample in samples.values():
        profile = catalog.gpu("V100-32GB" if sample.replica == "v100" else "A100-80GB")
        assert sample.gpu_util_pct is not None
        assert 0 <= sample.gpu_util_pct <= 100
        assert sample.fb_used_mib is not None
        assert sample.fb_total_mib == profile.memory_mib
        assert 0 < sample.fb_used_mib < sample.fb_total_mib
        assert profile.idle_w is not None
        assert profile.tdp_w is not None
        assert sample.power_w is not None
        assert profile.idle_w <= sample.power_w <= profile.tdp_w
        assert sample.power_limit_w == profile.tdp_w
        assert sample.temp_c is not None
        assert 30 <= sample.temp_c <= 90
        assert sample.sm_clock_mhz is not None
        assert 100 <= sample.sm_clock_mhz <= 2000
    assert samples["a100"].gpu_util_pct is not None
    assert samples["a100"].gpu_util_pct > 0
    assert samples["v100"].gpu_util_pct == 0
    assert samples["v100"].power_w == catalog.gpu("V100-32GB").idle_w
    tp = [s for s in fleet.gpu_samples(NODE) if s.replica == "tp"]
    assert [s.index for s in tp] == [3, 4]
    assert tp[0].fb_used_mib == tp[1].fb_used_mib
    assert tp[0].fb_used_mib is not None
    assert samples["a100"].fb_used_mib is not None
    assert tp[0].fb_used_mib == pytest.approx(samples["a100"].fb_used_mib / 2, abs=1)
    batch = GpuBatch(NODE, 1, 0, time.time(), 1.0, tuple(fleet.gpu_samples(NODE)))
    assert decode_gpus(encode(batch)) == batch


def test_gpu_profiles_may_give_power_figures_and_default_idle_from_tdp(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "gpus.yaml"
    path.write_text(
        "gpus:\n  Mine:\n    fp16_tflops: 100\n    bf16: true\n    bandwidth_gbs: 500\n"
        "    memory_mib: 16384\n    tdp_w: 200\n"
    )
    mine = load_catalog([path]).gpu("Mine")
    assert mine.tdp_w == 200
    assert mine.idle_w is None
    assert mine.idle_power_w == pytest.approx(34.0)


async def test_a_gpu_inside_one_long_step_reads_busy_not_idle() -> None:
    """A V100 prefilling a full chunk runs one step of about 1.6 engine seconds; a reading
    window that falls wholly inside that step must read the GPU busy. (Busy time used to be
    counted when a step started, so such a window read 0.0 on a loaded card.)"""
    # Ten thousand times slower than life: the one step lasts hours of wall time, so every
    # reading below falls inside it however slow the machine is.
    spec = Spec("v100", gpu="V100-32GB")
    emulated = EmulatedFleet(fleet_config(spec), time_scale=1e-4, ports=any_ports([spec]))
    async with emulated:
        replica = emulated.replicas["v100"]
        replica.driver.submit(8000, 1)
        await until(lambda: replica.engine.busy_seconds > 0)
        emulated.gpu_samples(NODE)  # the window opens inside the step
        readings = []
        for _ in range(3):
            await asyncio.sleep(0.01)
            (sample,) = emulated.gpu_samples(NODE)
            readings.append(sample.gpu_util_pct)
        assert replica.engine.step_no == 0  # all three readings fell inside the first step
        assert readings == [100.0, 100.0, 100.0]
