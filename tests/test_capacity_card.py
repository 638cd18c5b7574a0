"""Learned capacity takes the card from the node agent's NVML name when the fleet file names
another: the prior is the performance model's on the card that is there, and the replica
is flagged."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
import pytest

from console import cli
from router.clock import ManualClock
from router.config.loader import load_fleet
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.replica import Replica, Telemetry
from router.telemetry.embedded_broker import EmbeddedBroker
from router.telemetry.nvml_sampler import NvmlSampler
from tests import telemetry_helpers as helpers
from tests.fake_nvml import FakeGpu, FakeNvml
from tests.http_support import routed_fleet
from tests.mqtt_fixtures import until
from tests.test_emulator_support import metric

FLEET = (
    Path(__file__).resolve().parent.parent / "examples" / "fleets" / "untuned-four-generations.yaml"
)
H100_NVML = "NVIDIA H100 80GB HBM3"
L4_NVML = "NVIDIA L4"


def _core() -> tuple[RouterCore, ManualClock]:
    clock = ManualClock()
    return RouterCore(load_fleet(FLEET), clock=clock, rng=random.Random(0)), clock


def _reads(replica: Replica, name: str | None, now: float) -> None:
    replica.telemetry = Telemetry(0.5, now, gpu_name=name)


def _prior_rate(core: RouterCore, replica: Replica) -> float:
    rate = core.capacity.per_replica[replica.index].prior.rate
    assert rate is not None
    return rate


def test_a_card_nvml_names_otherwise_than_the_fleet_file_is_modelled_as_what_it_is() -> None:
    """An "L4" whose agent reads an H100 gets the H100's prior and is flagged; once its agent
    reads an L4 again, it is an L4 and the flag goes."""
    core, clock = _core()
    l4, h100 = core.replica("l4-0"), core.replica("h100-0")
    as_declared = _prior_rate(core, l4)
    assert _prior_rate(core, h100) > 10 * as_declared

    _reads(l4, H100_NVML, clock())
    core.refresh_capacity()
    assert _prior_rate(core, l4) == pytest.approx(_prior_rate(core, h100))
    assert l4.gpu_mismatch == f"NVML reports {H100_NVML}, fleet file says L4"
    assert l4.speed == pytest.approx(h100.speed)  # at once, not through the estimates' filter

    _reads(l4, L4_NVML, clock())
    core.refresh_capacity()
    assert _prior_rate(core, l4) == pytest.approx(as_declared)
    assert l4.gpu_mismatch is None


def test_the_card_is_modelled_on_the_mix_served_so_far() -> None:
    """With requests already served, the new card's model runs on their lengths, as every
    other replica's does, not on the default shape."""
    core, clock = _core()
    for _ in range(200):
        core.capacity.mix.add(2000, 50, 2050.0)
    clock.advance(1.0)
    core.refresh_capacity()
    l4, h100 = core.replica("l4-0"), core.replica("h100-0")
    _reads(l4, H100_NVML, clock())
    clock.advance(1.0)
    core.refresh_capacity()
    assert _prior_rate(core, l4) == pytest.approx(_prior_rate(core, h100))
    assert core.capacity.per_replica[l4.index].prior.cost == pytest.approx(
        core.capacity.per_replica[h100.index].prior.cost
    )
    # At once at the new card's prior; the H100 itself follows the new mix through the filter.
    assert l4.speed == pytest.approx(_prior_rate(core, l4) * core.capacity.calibration)


@pytest.mark.parametrize(
    "name",
    [
        L4_NVML,  # the declared card
        "l4",  # its profile's name, as the profiles spell names in any case
        "NVIDIA GeForce RTX 5090",  # a card the profiles do not know: the fleet file stands
        None,  # the replica's GPUs disagree, or gave no name
    ],
)
def test_a_name_that_is_the_declared_card_or_unknown_changes_nothing(name: str | None) -> None:
    core, clock = _core()
    l4 = core.replica("l4-0")
    before = core.capacity.per_replica[l4.index].prior
    _reads(l4, name, clock())
    core.refresh_capacity()
    assert core.capacity.per_replica[l4.index].prior is before
    assert l4.gpu_mismatch is None


async def test_an_agent_naming_another_card_is_shown_in_the_admin_state_metrics_and_ctl(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real path: the node agent reads NVML (the fake: GPU 0 of the "L4" node
    is an H100, swapped in a repair), publishes over the embedded broker, and the router
    models that replica as an H100 and says so; its neighbours on real L4s are left alone."""
    for name in ("GPUROUTER_ADMIN", "GPUROUTER_ADMIN_TOKEN", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    config = helpers.fleet()
    nvml = FakeNvml([FakeGpu(name=H100_NVML)] + [FakeGpu(name=L4_NVML) for _ in range(3)])
    sampler = NvmlSampler(nvml, period_s=helpers.PERIOD_S, read_pcie=False)
    async with (
        EmulatedFleet(config, time_scale=100.0, ports={r.id: 0 for r in config.replicas}) as emu,
        EmbeddedBroker() as broker,
    ):
        server = RouterServer(
            routed_fleet(config, emu), listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
        )
        await server.start()
        try:
            core = server.core
            sub = helpers.subscriber(config, core, broker.url)
            node_agent = helpers.agent(config, "l4-node", broker.url, sampler)
            async with helpers.started(sub), helpers.running(node_agent):
                await until(
                    lambda: helpers.feed(sub, "l4-node").samples >= 1, what="the L4 node read"
                )
                core.refresh_capacity()
                async with httpx.AsyncClient() as http:
                    state = (await http.get(server.admin_url + "/admin/state")).json()
                    text = (await http.get(server.front_url + "/metrics")).text
                args = ["ctl", "--admin", server.admin_url, "status"]
                code = await asyncio.to_thread(cli.main, args)
        finally:
            await server.stop(grace_s=0)
    mismatch = f"NVML reports {H100_NVML}, fleet file says L4"
    replicas = {r["id"]: r for r in state["replicas"]}
    assert replicas["l4-0"]["gpu_mismatch"] == mismatch
    assert replicas["l4-0"]["capacity_prior_gpu"] == "H100-SXM"
    assert (replicas["l4-1"]["gpu_mismatch"], replicas["l4-1"]["capacity_prior_gpu"]) == (
        None,
        "L4",
    )
    assert replicas["l4-0"]["capacity_prior_rps"] > 10 * replicas["l4-1"]["capacity_prior_rps"]
    gauge = "gpurouter_replica_gpu_mismatch"
    assert metric(text, f'{gauge}{{declared="L4",replica="l4-0",reported="{H100_NVML}"}}') == 1.0
    assert metric(text, f'{gauge}{{declared="L4",replica="l4-1",reported="{L4_NVML}"}}') == 0.0
    assert f'{gauge}{{declared="H100-SXM"' not in text  # no agent on that node: no reading
    assert code == 0
    out = capsys.readouterr().out
    assert f"card: l4-0 {mismatch}" in out.splitlines()
    assert "card: l4-1" not in out
