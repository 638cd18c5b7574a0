"""How one request moves an engine's counters: values, not only names.

The router reads an engine's counters moving (generation tokens and request successes tell a
working engine from a frozen one; learned capacity counts finished requests), so the contract
holds the emulator to vLLM's arithmetic too: one completion of a known length, ``/metrics``
read before and after, and the change of each sample below. Only what a request of that
length fixes is compared: never prompt token counts (each tokenizer counts its own) nor
times.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["DELTA_SAMPLES", "observe_deltas"]

DELTA_SAMPLES: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("vllm:request_success_total", {"finished_reason": "length"}),
    ("vllm:request_success_total", {"finished_reason": "stop"}),
    ("vllm:generation_tokens_total", {}),
    ("vllm:num_preemptions_total", {}),
    ("vllm:num_requests_running", {}),
    ("vllm:num_requests_waiting", {}),
    ("vllm:time_to_first_token_seconds_count", {}),
    ("vllm:inter_token_latency_seconds_count", {}),
    ("vllm:request_time_per_output_token_seconds_count", {}),
    ("vllm:e2e_request_latency_seconds_count", {}),
    ("vllm:request_queue_time_seconds_count", {}),
    ("vllm:request_prefill_time_seconds_count", {}),
    ("vllm:request_decode_time_seconds_count", {}),
    ("vllm:request_inference_time_seconds_count", {}),
    ("vllm:request_prompt_tokens_count", {}),
    ("vllm:request_generation_tokens_sum", {}),
    ("vllm:request_params_max_tokens_sum", {}),
    ("vllm:request_params_n_sum", {}),
    ("vllm:request_num_preemptions_count", {}),
    ("vllm:iteration_tokens_total_count", {}),
)
"""Sample name and the labels it must carry; the change is summed over matching series."""

_OUTPUT_TOKENS = 6


async def observe_deltas(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    """One completion of ``_OUTPUT_TOKENS`` tokens, and what it changed on ``/metrics``."""
    before = await _scrape(client)
    body = {
        "model": model,
        "prompt": "One request, counted.",
        "max_tokens": _OUTPUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = await client.post("/v1/completions", json=body)
    after = await _scrape(client)
    deltas = {
        _key(name, labels): round(_sum(after, name, labels) - _sum(before, name, labels), 6)
        for name, labels in DELTA_SAMPLES
    }
    return {"status": response.status_code, "body": deltas}


async def _scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    response.raise_for_status()
    return response.text


def _sum(text: str, name: str, labels: Mapping[str, str]) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _key(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if inner else name
