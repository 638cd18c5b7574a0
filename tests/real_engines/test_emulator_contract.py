"""Real vLLM keeps the contract the emulator is held to (tests/contract/): the golden file is
what a real engine answers, today, and a new vLLM version is one rerun.

``GPUROUTER_RECORD_CONTRACT=1`` records the golden file again from the lab's first engine
(named by its version, e.g. ``vllm-0.32.json``), then checks that a second observation gives
the same shapes, so a recording is never of something that varies between runs.
"""

from __future__ import annotations

import os

import pytest

from router.lab import Lab
from tests.contract.vllm_contract import (
    compare,
    golden_name,
    latest_golden,
    load_golden,
    observe,
    record,
    server_version,
)

RECORD = os.environ.get("GPUROUTER_RECORD_CONTRACT") == "1"


@pytest.mark.real_engine_smoke
async def test_real_vllm_answers_in_the_recorded_shapes(vllm_lab: Lab) -> None:
    engine = vllm_lab.engines[0]
    if RECORD:
        path = await record(engine.url, engine.model)
        golden = load_golden(path)
    else:
        golden = load_golden()
        version = await server_version(engine.url)
        assert golden_name(version) == latest_golden().name, (
            f"the lab runs vLLM {version}, the newest golden file is {latest_golden().name}: "
            "record it with GPUROUTER_RECORD_CONTRACT=1"
        )
    found = compare(golden, await observe(engine.url, engine.model), emulator=False)
    assert not found, f"vLLM departs from {golden['version']}'s recording:\n" + "\n".join(found)
