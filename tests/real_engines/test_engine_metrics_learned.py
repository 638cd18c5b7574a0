"""What gpurouter learns from a real engine's /metrics: its KV-cache size from
``vllm:cache_config_info`` and its preemptions, both in the router's admin state."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from router.config.schema import HealthConfig
from router.lab import Engine, Lab, ServeOptions
from tests.real_engines.lab_router import (
    admin_state,
    counter,
    engine_metrics,
    eventually,
    fleet_of,
    replica_state,
    routed,
)

POLLED = HealthConfig(check_interval_s=0.0, eject_after_failures=0, engine_metrics_interval_s=0.5)
TIGHT_BLOCKS = 24
"""KV-cache blocks of the preempting engine: enough for one request of the longest context
(2048 tokens) at vLLM's CPU block size, far too few for what the test sends at once."""


def _labels(metrics: str, family: str) -> dict[str, str]:
    line = next(line for line in metrics.splitlines() if line.startswith(family + "{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _kv_tokens(metrics: str) -> int:
    """The engine's KV-cache size in tokens, read from its cache-config labels."""
    labels = _labels(metrics, "vllm:cache_config_info")
    return int(labels["num_gpu_blocks"]) * int(labels["block_size"])


async def test_each_engines_kv_size_is_learned_from_its_cache_config(vllm_lab: Lab) -> None:
    expected = {e.name: _kv_tokens(await engine_metrics(e)) for e in vllm_lab.engines[:2]}
    # The two models differ in KV bytes per token: one cache holds more tokens than the other.
    assert len(set(expected.values())) == 2
    async with routed(fleet_of(vllm_lab), health=POLLED) as server:

        async def learned() -> bool:
            state = await admin_state(server)
            return all(
                replica_state(state, name)["kv_capacity_source"] == "engine" for name in expected
            )

        await eventually(learned, "every replica's KV size read from its engine")
        state = await admin_state(server)
        for name, tokens in expected.items():
            assert replica_state(state, name)["kv_capacity_tokens"] == tokens


@pytest.fixture
def tight_engine(vllm_lab: Lab) -> Iterator[Engine]:
    """One more engine of the small model with a KV cache of ``TIGHT_BLOCKS`` blocks."""
    options = ServeOptions(kv_blocks=TIGHT_BLOCKS)
    engine = vllm_lab.add_engine(size="small", core=0, options=options)
    yield engine
    vllm_lab.remove_engine(engine)


async def test_preemptions_are_read_from_the_engines_metrics(
    vllm_lab: Lab, tight_engine: Engine
) -> None:
    async with (
        routed(fleet_of(vllm_lab, [tight_engine]), health=POLLED) as server,
        httpx.AsyncClient(timeout=httpx.Timeout(300)) as client,
    ):
        body = {"model": tight_engine.model, "prompt": "hi", "max_tokens": 600, "ignore_eos": True}
        url = server.front_url + "/v1/completions"
        answers = await asyncio.gather(*(client.post(url, json=body) for _ in range(16)))
        assert [a.status_code for a in answers] == [200] * 16

        preempted = counter(await engine_metrics(tight_engine), "vllm:num_preemptions_total")
        assert preempted > 0

        async def seen() -> bool:
            state = replica_state(await admin_state(server), tight_engine.name)
            return bool(state["engine_preemptions"] == preempted)

        await eventually(seen, f"the router's count of preemptions at the engine's {preempted}")
        state = replica_state(await admin_state(server), tight_engine.name)
        assert state["kv_capacity_tokens"] == _kv_tokens(await engine_metrics(tight_engine))
