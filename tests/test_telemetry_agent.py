"""The node agent: NVML readings (through the fake NVML), drops while disconnected, backoff,
and the ``gpurouter agent`` command."""

from __future__ import annotations

import json
import random

import pynvml
import pytest

from console.cli import main
from router.core import RouterCore
from router.telemetry.connection import Backoff
from router.telemetry.embedded_broker import EmbeddedBroker
from router.telemetry.nvml_sampler import NvmlSampler
from router.telemetry.schema import decode_gpus, decode_status
from tests.fake_nvml import FakeGpu, FakeNvml
from tests.mqtt_fixtures import free_port, until
from tests.telemetry_helpers import (
    FLEET_FILE,
    PERIOD_S,
    agent,
    feed,
    fleet,
    running,
    started,
    subscriber,
)


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", gpu_util=87),
            FakeGpu(uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", gpu_util=20),
        ]
    )


async def test_nvml_agent_feeds_replicas_and_reports_a_gpu_that_fell_off_the_bus() -> None:
    """NVML readings reach the router; when GPU 1 is lost the agent says so and keeps
    publishing, GPU 0's replica stays fresh and GPU 1's goes stale."""
    config = fleet()
    core = RouterCore(config)
    nvml = two_gpus()
    sampler = NvmlSampler(nvml, period_s=PERIOD_S, read_pcie=False)
    async with EmbeddedBroker() as broker, started(subscriber(config, core, broker.url)) as sub:
        node_agent = agent(config, "h100-node", broker.url, sampler)
        async with running(node_agent):
            await until(lambda: feed(sub, "h100-node").samples >= 2, what="NVML samples")
            node = feed(sub, "h100-node")
            assert node.driver == "550.54.15"
            assert node.inventory[0].uuid == "GPU-aaaaaaaa-0000-0000-0000-000000000000"
            h100_0 = core.replica("h100-0").telemetry
            assert h100_0 is not None
            assert h100_0.utilization == 0.87
            nvml.gpus[1].lost = True
            await until(lambda: any(g.lost for g in feed(sub, "h100-node").gpus), what="GPU 1 lost")
            stale_after = 3 * PERIOD_S
            await until(
                lambda: not core.replica("h100-1").utilization(core.clock(), stale_after)[1],
                what="GPU 1's replica stale",
            )
            assert core.replica("h100-0").utilization(core.clock(), stale_after) == (0.87, True)
            assert node_agent.stats.connected
            assert node_agent.stats.sample_errors == 0
            assert feed(sub, "h100-node").gpus[1].error == str(
                pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            )
    assert nvml.init_count == 0  # NVML shut down on exit


async def test_without_a_broker_samples_are_dropped_not_queued_and_it_connects_later() -> None:
    """While nothing listens, no reading is taken or kept (each missed period counts as
    dropped); once a broker appears the agent connects and sends from a fresh session."""
    config = fleet()
    core = RouterCore(config)
    nvml = two_gpus()
    port = free_port()
    url = f"mqtt://127.0.0.1:{port}"
    node_agent = agent(config, "h100-node", url, NvmlSampler(nvml, period_s=PERIOD_S))
    async with running(node_agent):
        await until(lambda: node_agent.stats.dropped >= 3, what="dropped periods")
        assert node_agent.stats.connects == 0
        assert "nvmlDeviceGetUtilizationRates" not in nvml.calls
        async with (
            EmbeddedBroker(port=port) as broker,
            started(subscriber(config, core, broker.url)) as sub,
        ):
            await until(lambda: feed(sub, "h100-node").samples >= 2, what="samples")
            assert node_agent.stats.connects == 1
            assert feed(sub, "h100-node").lost_samples == 0


def test_backoff_doubles_up_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not lockstep
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_agent_once_json_prints_payloads_receivers_accept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``gpurouter agent --once --json`` prints one status and one batch that decode."""
    args = ["agent", "--once", "--json", "--emulate", "--config", str(FLEET_FILE)]
    assert main([*args, "--node", "l4-node"]) == 0
    report = json.loads(capsys.readouterr().out)
    status = decode_status(json.dumps(report["status"]).encode())
    batch = decode_gpus(json.dumps(report["gpus"]).encode())
    assert [g.name for g in status.gpus] == ["NVIDIA L4"] * 4
    assert [g.replica for g in batch.gpus] == ["l4-0", "l4-1", "l4-2", "l4-3"]
    assert report["payload_bytes"]["gpus"] > 0


def test_agent_refuses_a_node_the_fleet_file_lacks_and_an_embedded_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["agent", "--emulate", "--config", str(FLEET_FILE)]
    assert main([*base, "--node", "nowhere"]) == 2
    assert "no node 'nowhere'" in capsys.readouterr().err
    assert main([*base, "--node", "l4-node"]) == 2
    assert "give --broker URL" in capsys.readouterr().err
