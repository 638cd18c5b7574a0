"""A real engine serving another model than the fleet file says (``tiny-llama-v2`` where the
file says ``tiny-llama``): the router learns it from the engine's own ``/v1/models``, sends it
none of ``tiny-llama``'s requests (before model-aware routing, 10 of 20 went there and got
404), flags it, lists both names, and sends it the requests for the name it does serve."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from router.http.proxy import REPLICA_HEADER
from router.http.server import RouterServer
from router.lab import Engine, Lab
from tests.real_engines.lab_router import (
    admin_state,
    fleet_of,
    openai_client,
    replica_state,
    routed,
)

V2 = "tiny-llama-v2"
REQUESTS = 20


@pytest.fixture
async def v2_engine(vllm_lab: Lab) -> AsyncIterator[Engine]:
    """One more engine (small, fast to start) serving ``tiny-llama-v2``; stopped after."""
    engine = await asyncio.to_thread(vllm_lab.add_engine, served_model=V2, size="small")
    try:
        yield engine
    finally:
        await asyncio.to_thread(vllm_lab.remove_engine, engine)


async def _served_by(server: RouterServer, model: str, n: int) -> Counter[str]:
    """``n`` completions for ``model`` at once; how many each replica served."""
    client = openai_client(server)
    try:
        responses = await asyncio.gather(
            *(
                client.completions.with_raw_response.create(
                    model=model, prompt="hello", max_tokens=4, extra_body={"ignore_eos": True}
                )
                for _ in range(n)
            )
        )
    finally:
        await client.close()
    return Counter(r.headers[REPLICA_HEADER.decode()] for r in responses)


async def test_an_engine_serving_another_name_gets_none_of_the_declared_models_requests(
    vllm_lab: Lab, v2_engine: Engine
) -> None:
    right = vllm_lab.engines[0]
    declared = vllm_lab.model
    # The fleet file says every replica serves `tiny-llama`; round-robin would send the
    # mismatching one every other request.
    fleet = fleet_of(vllm_lab, [right, v2_engine])
    assert {r.model for r in fleet.replicas} == {declared}
    async with routed(fleet, strategy="round-robin") as server:
        to_declared = await _served_by(server, declared, REQUESTS)
        to_v2 = await _served_by(server, V2, 4)
        state = await admin_state(server)
        client = openai_client(server)
        try:
            listed = [m.id for m in (await client.models.list()).data]
            with pytest.raises(openai.NotFoundError) as unknown:
                await client.completions.create(model="gpt-9", prompt="hi", max_tokens=1)
        finally:
            await client.close()
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(server.front_url + "/metrics")).text
    print(
        f"\n{declared}: {dict(to_declared)} of {REQUESTS}; {V2}: {dict(to_v2)}; "
        f"flag: {v2_engine.name} {replica_state(state, v2_engine.name)['model_mismatch']}; "
        f"/v1/models: {listed}"
    )
    assert to_declared == {right.name: REQUESTS}
    assert to_v2 == {v2_engine.name: 4}
    flag = f"serves {V2}, fleet file says {declared}"
    assert replica_state(state, v2_engine.name)["model_mismatch"] == flag
    assert replica_state(state, right.name)["model_mismatch"] is None
    assert state["served_models"][v2_engine.name]["served"] == [V2]
    assert listed == sorted([declared, V2])
    assert unknown.value.status_code == 404
    assert f"served: {declared}, {V2}" in str(unknown.value)
    gauge = (
        f'gpurouter_replica_model_mismatch{{declared="{declared}",'
        f'replica="{v2_engine.name}",served="{V2}"}} 1.0'
    )
    assert gauge in metrics.splitlines()
