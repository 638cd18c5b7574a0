"""Two routers in front of the same emulated replicas, sharing a real broker on loopback (the
embedded one and Mosquitto), each running its control link as ``gpurouter serve`` does: a
canary's split set through one router's admin API is applied by the other, and a rollout run
by one router has its drain held by the other while the replica is being updated. Every wait
polls a condition, bounded."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from router.config.schema import (
    BrokerConfig,
    CommandUpdaterConfig,
    RolloutConfig,
    UpdaterConfig,
)
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.replica import ReplicaState
from router.telemetry.feeds import RouterFeeds
from tests.http_support import MODEL, Spec, openai_client, routed_fleet
from tests.mqtt_fixtures import Broker, until
from tests.rollout_support import GATED
from tests.test_emulator_support import any_ports, fleet_config

NEW = "Llama-3.1-8B-v2"
ROUTERS = ("router-a", "router-b")


@dataclasses.dataclass
class Cluster:
    servers: list[RouterServer]
    feeds: list[RouterFeeds]

    async def post(self, router: int, path: str, **body: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30.0) as client:
            answer = await client.post(
                self.servers[router].admin_url + path, json=body, headers={"X-Actor": "dana"}
            )
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    async def send(self, router: int, n: int) -> dict[str, int]:
        """``n`` requests for the model through one router: what each replica completed."""
        server = self.servers[router]
        before = {r.id: r.completed for r in server.core.pool}
        client = openai_client(server)
        for _ in range(n):
            await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
        await client.close()
        return {r.id: r.completed - before[r.id] for r in server.core.pool}


@asynccontextmanager
async def cluster(
    specs: tuple[Spec, ...],
    broker: Broker,
    *,
    versions: dict[str, str] | None = None,
    gate: Path | None = None,
) -> AsyncIterator[Cluster]:
    """Emulated replicas (``versions``: some declared on another version) and two routers on
    ``broker``, each one's commands and rollouts published through its control link;
    ``gate``: the fleet file's updater switches a replica once that file exists."""
    config = fleet_config(*specs)
    node = config.nodes[0]
    replicas = tuple(
        dataclasses.replace(r, version=(versions or {}).get(r.id)) for r in node.replicas
    )
    config = dataclasses.replace(config, nodes=(dataclasses.replace(node, replicas=replicas),))
    async with (
        EmulatedFleet(config, time_scale=100.0, ports=any_ports(specs)) as emulated,
        AsyncExitStack() as stack,
    ):
        fleet = dataclasses.replace(
            routed_fleet(config, emulated),
            broker=BrokerConfig(url=broker.url, sample_period_s=0.1, keepalive_s=5),
        )
        if gate is not None:
            port = await emulated.start_control()
            fleet = dataclasses.replace(fleet, rollout=_gated(port, gate))
        made = Cluster([], [])
        for name in ROUTERS:
            server = RouterServer(fleet, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
            await server.start()
            stack.push_async_callback(server.stop, 0)
            feeds = RouterFeeds(fleet, server.control, router_id=name)
            await feeds.start()
            stack.push_async_callback(feeds.stop)
            server.route_commands(feeds.apply)  # as `gpurouter serve` does
            made.servers.append(server)
            made.feeds.append(feeds)

        def each_hears_both() -> bool:
            return all(f.link is not None and len(f.link.routers()) == 2 for f in made.feeds)

        await until(each_hears_both, what="each router hearing both routers' stats")
        yield made


def _gated(control_port: int, gate: Path) -> RolloutConfig:
    """An update command held until ``gate`` exists, then the emulator's version switch."""
    script = gate.with_name("gated_update.py")
    script.write_text(GATED)
    url = f"http://127.0.0.1:{control_port}/versions/{{replica}}"
    run = f"{sys.executable} {script} {gate} {url} {{version}} {MODEL}"
    updater = UpdaterConfig(command=CommandUpdaterConfig(run=run, timeout_s=60))
    return RolloutConfig(floor=0.4, check_interval_s=0.01, updater=updater)


async def test_a_canary_split_set_on_one_router_is_applied_by_the_other(
    mqtt_broker: Broker,
) -> None:
    specs = (Spec("b0"), Spec("g0"))
    async with cluster(specs, mqtt_broker, versions={"g0": NEW}) as c:
        a, b = c.servers
        started = await c.post(0, "/admin/split", action="canary", version=NEW, manual=True)
        assert started["split"]["share"] == 0.0
        await until(lambda: b.core.split is not None, what="router-b applying the split")
        assert await c.send(1, 8) == {"b0": 8, "g0": 0}
        await c.post(0, "/admin/split", action="step", percent=100)
        await until(
            lambda: b.core.split is not None and b.core.split.share == 1.0,
            what="router-b applying the 100% step",
        )
        assert await c.send(1, 8) == {"b0": 0, "g0": 8}
        assert await c.send(0, 8) == {"b0": 0, "g0": 8}
        ended = await c.post(0, "/admin/split", action="abort")
        assert ended["split"]["phase"] in ("rolling back", "aborted")
        # Each router applies the unsplit when the broker delivers it, router-a's own
        # included: either may be first.
        await until(lambda: b.core.split is None, what="router-b ending the split")
        await until(lambda: a.core.split is None, what="router-a ending the split")
        kinds = [(e.kind, e.actor) for e in b.control.audit if e.kind in ("split", "unsplit")]
        assert [k for k, _ in kinds] == ["split", "split", "split", "unsplit"]
        assert {actor for _, actor in kinds} == {"mqtt:rollout@router-a"}


async def test_a_rollout_on_one_router_has_its_drain_held_by_the_other(
    mqtt_broker: Broker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    specs = (Spec("a0"), Spec("v0", gpu="V100-32GB"), Spec("v1", gpu="V100-32GB"))
    async with cluster(specs, mqtt_broker, gate=gate) as c:
        a, b = c.servers
        rollout = (await c.post(0, "/admin/rollout", action="start", version=NEW))["rollout"]
        first = rollout["plan"]["waves"][0]["replicas"]

        def updating() -> bool:
            return a.rollouts.status() is not None and any(
                step == "updating" for step in (a.rollouts.status() or {})["steps"].values()
            )

        await until(updating, what="router-a's first wave being updated")
        # Held out on the other router too: it sends the replicas being updated nothing.
        assert {b.core.replica(r).state for r in first} == {ReplicaState.DRAINED}
        sent = await c.send(1, 6)
        assert all(sent[r] == 0 for r in first)
        gate.touch()

        def ended() -> bool:
            status = a.rollouts.status()
            return status is not None and status["phase"] not in ("running", "paused")

        await until(ended, what="the rollout's end")
        assert (a.rollouts.status() or {})["phase"] == "done"
        await until(
            lambda: {r.state for r in b.core.pool} == {ReplicaState.ACTIVE},
            what="router-b readmitting every replica",
        )
        await until(
            lambda: {r.version for r in b.core.pool} == {NEW},
            what="router-b learning each replica's new version",
        )
        drains = [e for e in b.control.audit if e.kind == "drain"]
        assert {e.args["replica"] for e in drains} == {"a0", "v0", "v1"}
        assert all(e.ok and e.actor == "mqtt:rollout@router-a" for e in drains)
