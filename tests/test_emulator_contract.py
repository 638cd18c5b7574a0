"""The emulator keeps vLLM's contract: the same requests give the same shapes as the golden
file recorded from a real vLLM engine (tests/contract/). No vLLM is needed to run it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.emulator import EmulatedFleet
from tests.contract.shape import differences, json_shape, metrics_shape, sse_shape
from tests.contract.vllm_contract import (
    NOT_EMULATED,
    compare,
    golden_name,
    latest_golden,
    load_golden,
    observe,
)
from tests.test_emulator_support import MODEL, TIME_SCALE, Spec, any_ports, fleet_config

SPECS = (Spec("a100", max_context=2048),)
"""As the lab's engines: ``--max-model-len 2048`` (the probes size their long prompt by it)."""


@pytest.fixture
async def emulated() -> AsyncIterator[EmulatedFleet]:
    fleet = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with fleet:
        yield fleet


async def test_the_emulator_answers_every_probe_in_the_shape_vllm_does(
    emulated: EmulatedFleet,
) -> None:
    golden = load_golden()
    found = compare(golden, await observe(emulated.url("a100"), MODEL), emulator=True)
    assert not found, f"the emulator departs from vLLM {golden['version']}:\n" + "\n".join(found)


def test_every_family_left_out_of_the_emulator_is_one_vllm_has() -> None:
    """A stale exclusion would hide a family the emulator should publish."""
    families = load_golden()["probes"]["metrics"]["body"]
    assert set(NOT_EMULATED) <= set(families)


def test_the_golden_file_holds_the_families_the_router_reads() -> None:
    """The router's scraper reads these; a recording without them is not of a real engine."""
    families = load_golden()["probes"]["metrics"]["body"]
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:num_preemptions",
    ):
        assert name in families, name
    assert "kv_cache_size_tokens" in families["vllm:cache_config_info"]["labels"]


def test_the_newest_golden_file_is_the_one_compared(tmp_path: Path) -> None:
    for name in ("vllm-0.9.json", "vllm-0.32.json", "vllm-0.10.json"):
        (tmp_path / name).write_text("{}")
    assert latest_golden(tmp_path).name == "vllm-0.32.json"
    assert golden_name("0.32.0+cpu") == "vllm-0.32.json"
    with pytest.raises(ValueError, match="not a vLLM version"):
        golden_name("dev")


def test_shapes_keep_keys_and_constants_and_drop_values() -> None:
    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 17, "choices": []}
    assert json_shape(chunk) == {
        "choices": [],
        "created": "<int>",
        "id": "<str>",
        "object": "text_completion",
    }
    assert json_shape({"error": {"code": 400, "param": None}}) == {
        "error": {"code": 400, "param": None}
    }


def test_a_stream_shape_collapses_runs_and_names_framing_faults() -> None:
    event = 'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n'
    long, short = sse_shape(event * 40 + "data: [DONE]\n\n"), sse_shape(event + "data: [DONE]\n\n")
    assert long == short
    assert len(long) == 2
    assert "framing" in sse_shape(event)  # no [DONE]
    assert "framing" in sse_shape("data: [DONE]\n")
    assert "framing" in sse_shape("event: x\ndata: [DONE]\n\n")


def test_metrics_shape_reads_type_labels_and_sample_names() -> None:
    page = (
        "# HELP vllm:num_preemptions_total Preemptions.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0\n'
        "# HELP python_gc_objects_collected_total GC.\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 1.0\n'
    )
    assert metrics_shape(page) == {
        "vllm:num_preemptions": {
            "type": "counter",
            "labels": ["engine", "model_name"],
            "samples": ["vllm:num_preemptions_total"],
        }
    }


def test_differences_name_the_path_of_each_change() -> None:
    expected = json.loads('{"a": {"b": "<int>", "c": ["<str>"]}, "d": 1}')
    actual = json.loads('{"a": {"b": "<str>", "c": []}, "e": 1}')
    assert differences(expected, actual) == [
        'a.b: expected "<int>", got "<str>"',
        'a.c[0]: missing item (expected "<str>")',
        "the answer: missing key 'd' (expected 1)",
        "the answer: unexpected key 'e' (1)",
    ]
    assert differences(expected, expected) == []
