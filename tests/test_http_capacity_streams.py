"""Over loopback: a replica the performance model does not know is measured from the streams
relayed through the front door, before any of its requests completes."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx

from router.capacity import Source
from router.config.schema import FleetConfig
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from tests.http_support import routed_fleet
from tests.test_emulator_support import Spec, any_ports, completion, fleet_config

UNKNOWN_CARD = "a card the profiles lack"
STREAMS = 4
OUTPUT = 2000
"""Long enough that none ends while the test looks (the emulated V100 takes seconds)."""


def _unknown_cards(fleet: FleetConfig) -> FleetConfig:
    """The same fleet with every replica on a GPU the performance model does not know, as a
    real engine on a CPU core is."""
    nodes = tuple(
        dataclasses.replace(
            n,
            replicas=tuple(dataclasses.replace(r, gpu_model=UNKNOWN_CARD) for r in n.replicas),
        )
        for n in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


async def _stream(client: httpx.AsyncClient, url: str, seen: asyncio.Event) -> None:
    body = completion(64, OUTPUT, max_tokens=OUTPUT, stream=True)
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                seen.set()


async def test_a_replica_the_model_does_not_know_is_measured_by_its_streams() -> None:
    specs = (Spec("v0", gpu="V100-32GB"),)
    config = fleet_config(*specs)
    async with EmulatedFleet(config, time_scale=1.0, ports=any_ports(specs)) as emulated:
        fleet = _unknown_cards(routed_fleet(config, emulated))
        server = RouterServer(fleet, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
        await server.start()
        try:
            core = server.core
            replica = core.replica("v0")
            url = server.front_url + "/v1/completions"
            async with httpx.AsyncClient(timeout=30.0) as client:
                seen = [asyncio.Event() for _ in range(STREAMS)]
                tasks = [asyncio.create_task(_stream(client, url, e)) for e in seen]
                try:
                    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in seen)), 20.0)
                    await asyncio.sleep(1.0)  # tokens on every stream
                    core.refresh_capacity()
                    estimate = core.capacity.estimate(replica, core.clock())
                    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
                        state = (await admin.get("/admin/state")).json()
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await server.stop(grace_s=0)
    assert replica.completed == 0
    assert estimate.completions == 0
    assert estimate.measured_rate is not None
    assert estimate.measured_rate > 0
    assert estimate.rate_source is Source.MEASURED
    assert estimate.rate_age_s is not None
    (row,) = state["replicas"]
    assert row["capacity_measured_rps"] is not None
    assert row["capacity_source"] == "measured"
