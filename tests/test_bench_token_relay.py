"""The token-relay and scaling benches' pieces: the SSE payload, the load generator's count
against the upstream (in-process, a few streams), the derived figures, the fleet file.
No timing is asserted: these only check that the benches measure what they say."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def relay() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the bench's own imports of its sibling modules
    path = BENCH / "bench_token_relay.py"
    spec = importlib.util.spec_from_file_location("bench_token_relay", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_token_relay"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_token_event_has_one_length_and_streams_add_up(relay: ModuleType) -> None:
    assert {len(relay.token_event(i)) for i in range(2000)} == {relay.EVENT_LENGTH}
    assert relay.stream_length(3) == 3 * relay.EVENT_LENGTH + len(b"data: [DONE]\n\n")


def test_first_requests_spread_over_the_whole_length(relay: ModuleType) -> None:
    firsts = [relay.first_request_tokens(k, 512, 256) for k in range(512)]
    assert min(firsts) == 1
    assert max(firsts) <= 256
    assert len(set(firsts)) == 256


@pytest.mark.parametrize("gap_ms", [2.0, 0.0])
async def test_the_load_generator_counts_every_token_the_upstream_sends(
    relay: ModuleType, gap_ms: float
) -> None:
    pacer, servers, ports = await relay.start_upstream(2)
    pacer.set_gap(gap_ms / 1000)
    try:
        sample = await relay.measure(ports[1], None, 4, 8, 0.05, 0.3)
    finally:
        pacer.set_gap(0)
        for server in servers:
            server.close()
            await server.wait_closed()
    assert sample.errors == 0
    assert sample.completed > 0
    assert sample.tokens > 0
    assert sample.cpu_s == 0.0  # no router: nothing to measure


def test_gpus_fronted_divide_the_worker_by_the_performance_model(relay: ModuleType) -> None:
    from calibrate import CONVERSATION

    from router.perf import Deployment, default_catalog, saturation

    out = relay.gpus_fronted(40.0)  # 40 CPU s per million tokens
    assert out["worker_tokens_per_s"] == pytest.approx(0.8 / 40e-6)
    catalog = default_catalog()
    h100 = Deployment(catalog.gpu("H100-SXM"), catalog.model("Llama-3.1-8B"))
    expected = 0.8 / 40e-6 / saturation(h100, CONVERSATION).output_tokens_per_s
    assert out["gpus"]["H100-SXM"]["gpus_per_worker"] == pytest.approx(expected)


def test_ratios_are_taken_round_by_round(relay: ModuleType) -> None:
    def sample(cpu: float) -> object:
        return relay.Sample(1_000_000, 1.0, 1e6, cpu, 10, 0)

    cells = {
        (relay.GPUROUTER_1, relay.PACED, 32): relay.Cell([sample(40), sample(60)]),
        (relay.VLLM_ROUTER, relay.PACED, 32): relay.Cell([sample(20), sample(20)]),
    }
    rows = {r["router"]: r for r in relay.summarize(cells)}
    assert rows[relay.GPUROUTER_1]["cpu_vs_vllm-router"] == pytest.approx(2.5)
    assert rows[relay.GPUROUTER_1]["cpu_s_per_million_tokens"] == pytest.approx(50)
    assert "cpu_vs_sglang-router" not in rows[relay.GPUROUTER_1]
    assert any("<= 3x: met" in line for line in relay.aims(relay.summarize(cells)))
    assert math.isnan(relay.Sample(0, 1.0, 0.0, 1.0, 0, 0).cpu_s_per_million)


@pytest.mark.usefixtures("relay")  # its sibling modules on the path
def test_the_generated_fleet_file_loads(tmp_path: Path) -> None:
    from routers_under_test import fleet_yaml

    from router.config import load_fleet

    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(["http://127.0.0.1:9", "http://127.0.0.1:10"], "m"))
    fleet = load_fleet(path)
    assert [r.batch_size for n in fleet.nodes for r in n.replicas] == [1024, 1024]
    assert fleet.router.health.check_interval_s == 0
