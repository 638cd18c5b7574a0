"""Helpers for the emulator's tests (no tests here): small fleets in code, SSE parsing, waits."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from router.config.schema import FleetConfig, GpuConfig, NodeConfig, ReplicaConfig

MODEL = "Llama-3.1-8B"
NODE = "node-0"
TIME_SCALE = 100.0


@dataclass(frozen=True)
class Spec:
    """One emulated replica of a test fleet."""

    id: str
    gpu: str = "A100-80GB"
    tp: int = 1
    kv_capacity: int | None = None
    max_context: int | None = None


def fleet_config(*specs: Spec, endpoint_host: str = "127.0.0.1") -> FleetConfig:
    """One node; each replica on its own GPUs; endpoints are placeholders (tests pass ports)."""
    gpus: list[GpuConfig] = []
    replicas: list[ReplicaConfig] = []
    for i, spec in enumerate(specs):
        indexes = tuple(range(len(gpus), len(gpus) + spec.tp))
        gpus.extend(GpuConfig(j, spec.gpu, 80.0) for j in indexes)
        replicas.append(
            ReplicaConfig(
                id=spec.id,
                node=NODE,
                endpoint=f"http://{endpoint_host}:{18900 + i}",
                model=MODEL,
                gpus=indexes,
                gpu_model=spec.gpu,
                kv_capacity_tokens=spec.kv_capacity,
                max_context_tokens=spec.max_context,
            )
        )
    return FleetConfig(nodes=(NodeConfig(NODE, tuple(gpus), tuple(replicas)),), model=MODEL)


def any_ports(specs: Sequence[Spec]) -> dict[str, int]:
    """Port 0 for every replica: the OS picks free ones."""
    return {s.id: 0 for s in specs}


def completion(prompt_tokens: int, output_tokens: int, **extra: Any) -> dict[str, Any]:
    """A completion body whose lengths are given by the gpurouter hint."""
    hint = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens}
    return {"model": MODEL, "prompt": "hello", "gpurouter": hint, **extra}


def sse_events(raw: str) -> list[str]:
    """The data of each Server-Sent Event in ``raw``; every event must be ``data: ...\\n\\n``."""
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def json_chunks(events: list[str]) -> list[dict[str, Any]]:
    """The JSON chunks of a stream that ends with ``[DONE]``."""
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def metric(text: str, name: str) -> float:
    """The value of the one sample called ``name`` (labels included in the match)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    """Wait (bounded) for a condition set by traffic on other connections."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.002)


async def scrape(client: httpx.AsyncClient, base: str) -> str:
    response = await client.get(base + "/metrics")
    assert response.status_code == 200
    return response.text
