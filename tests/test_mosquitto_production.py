"""The production Mosquitto of docs/telemetry.md, run for real: its ACL lets each component
do its work and nothing else, and its persistence keeps a retained command across a crash.

The configuration is read from the docs, so the docs cannot drift from what was tested.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiomqtt
import pytest

from router.config.schema import BrokerConfig
from router.control import ControlSurface, Drain, SetStrategy
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.replica import ReplicaState
from router.telemetry.agent import EmulatedSource, NodeAgent, node_replicas
from router.telemetry.connection import BrokerTarget, resolve_target
from router.telemetry.control_topics import ControlLink, ControlPublisher, encode_desired
from router.telemetry.subscriber import TelemetrySubscriber
from router.telemetry.topics import Topics
from tests.mqtt_fixtures import Mosquitto, mosquitto_binary, until
from tests.telemetry_helpers import PERIOD_S, feed, fleet, quick_backoff, running, started

DOCS = Path(__file__).resolve().parents[1] / "docs" / "telemetry.md"
TOPICS = Topics("h100-a100-l4")
SECRET = b"test-control-secret-0123"
USERS = ("h100-node", "router", "operator")


def doc_block(first_line: str) -> str:
    """The ```conf block of docs/telemetry.md that starts with ``first_line``."""
    for block in re.findall(r"```conf\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL):
        if block.startswith(first_line):
            return str(block)
    raise AssertionError(f"docs/telemetry.md has no conf block starting {first_line!r}")


def persistence_lines(location: Path) -> str:
    """The documented persistence settings, the database kept in ``location``."""
    conf = doc_block("# /etc/mosquitto/conf.d/gpurouter.conf")
    lines = [ln for ln in conf.splitlines() if ln.startswith(("persistence", "autosave"))]
    assert {ln.split()[0] for ln in lines} == {
        "persistence",
        "persistence_location",
        "autosave_on_changes",
        "autosave_interval",
    }
    return "".join(
        f"persistence_location {location}/\n"
        if ln.startswith("persistence_location")
        else ln + "\n"
        for ln in lines
    )


def login(url: str, user: str) -> BrokerTarget:
    config = BrokerConfig(keepalive_s=5, username=user, password_env="PW")
    return resolve_target(config, url=url, environ={"PW": f"{user}-password"})


async def accounts(binary: str, workdir: Path) -> Path:
    tool = shutil.which("mosquitto_passwd") or str(Path(binary).parents[1] / "bin/mosquitto_passwd")
    passwords = workdir / "passwd"
    passwords.write_text("")
    for user in USERS:
        made = await asyncio.create_subprocess_exec(
            tool, "-b", str(passwords), user, f"{user}-password"
        )
        assert await made.wait() == 0
    return passwords


@pytest.fixture
async def production(tmp_path: Path) -> AsyncIterator[Mosquitto]:
    """Mosquitto with accounts and the documented ACL and persistence."""
    binary = mosquitto_binary()
    acl = tmp_path / "gpurouter.acl"
    acl.write_text(doc_block("# /etc/mosquitto/gpurouter.acl"))
    settings = f"acl_file {acl}\n" + persistence_lines(tmp_path)
    broker = Mosquitto(binary, tmp_path, await accounts(binary, tmp_path), settings)
    await broker.start()
    yield broker
    await broker.stop()


async def test_each_component_works_under_its_account_and_nothing_more(
    production: Mosquitto,
) -> None:
    url = production.url
    config = fleet()
    core = RouterCore(config)
    surface = ControlSurface(core)
    link = ControlLink(
        surface,
        target=login(url, "router"),
        router_id="ra",
        stats_period_s=0.05,
        backoff=quick_backoff(),
        secret=SECRET,
    )
    replica_map, models = node_replicas(config, "h100-node")
    agent = NodeAgent(
        "h100-node",
        EmulatedSource(EmulatedFleet(config), period_s=PERIOD_S),
        target=login(url, "h100-node"),
        cluster=config.cluster,
        replica_map=replica_map,
        models=models,
        backoff=quick_backoff(),
    )
    sub = TelemetrySubscriber(config, core, broker=login(url, "router"), backoff=quick_backoff())
    watcher = aiomqtt.Client(
        "127.0.0.1", production.port, username="operator", password="operator-password"
    )
    await link.start()
    try:
        async with started(sub), running(agent), watcher:
            await watcher.subscribe("gpurouter/v1/#", qos=1)
            await until(lambda: feed(sub, "h100-node").samples >= 2, what="the agent's samples")
            async with ControlPublisher(
                login(url, "operator"), TOPICS.cluster, origin="alice", secret=SECRET
            ) as operator:
                await operator.publish(SetStrategy("least-connections"))
            seen = await watch(watcher, {"acks", "stats", "events"}, lambda _: False)
            assert seen == {"acks", "stats", "events"}  # the router may answer
            assert core.strategy.name == "least-connections"

            forged = encode_desired(
                Drain("h100-0"),
                10**12,
                "mallory",
                1.0,
                topic=TOPICS.desired("service/h100-0"),
                secret=SECRET,  # even with the secret: the broker is the first line
            )
            for user, forbidden, marker in (
                ("h100-node", TOPICS.desired("service/h100-0"), TOPICS.gpus("h100-node")),
                ("h100-node", TOPICS.gpus("l4-node"), TOPICS.gpus("h100-node")),
                # Routers publish desired state (a command given to their admin API), not
                # telemetry.
                ("router", TOPICS.gpus("h100-node"), TOPICS.events),
            ):
                async with aiomqtt.Client(
                    "127.0.0.1", production.port, username=user, password=f"{user}-password"
                ) as client:
                    await client.publish(forbidden, forged, qos=1)
                    await client.publish(marker, b"marker", qos=1)
                arrived = await watch(
                    watcher, set(), lambda m: m.payload == b"marker", (forbidden, forged)
                )
                assert forbidden not in arrived, f"{user} could publish on {forbidden}"
    finally:
        await link.stop()
    assert core.replica("h100-0").state is ReplicaState.ACTIVE
    assert link.dropped == 0  # the forged drain never reached the router
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client("127.0.0.1", production.port, identifier="anonymous"):
            pass


async def watch(
    watcher: aiomqtt.Client,
    kinds: set[str],
    done: Callable[[aiomqtt.Message], bool],
    forbidden: tuple[str, bytes] | None = None,
) -> set[str]:
    """Read the watcher until it has seen a message of every kind in ``kinds`` (acks,
    stats, events) or one for which ``done`` holds; what it saw (kinds, and the forbidden
    topic if the forbidden payload came on it: the node agent running beside publishes its
    own samples on its telemetry topic, and those were read as the forged message)."""
    seen: set[str] = set()
    async with asyncio.timeout(10):
        async for message in watcher.messages:
            topic = message.topic.value
            if forbidden is not None and (topic, message.payload) == forbidden:
                seen.add(topic)
            elif "/control/acks/" in topic:
                seen.add("acks")
            elif topic.endswith("/stats"):
                seen.add("stats")
            elif topic.endswith("/events"):
                seen.add("events")
            if (kinds and kinds <= seen) or done(message):
                return seen
    raise AssertionError("unreachable")


async def test_a_retained_command_survives_kill_9_with_the_documented_persistence(
    tmp_path: Path,
) -> None:
    broker = Mosquitto(mosquitto_binary(), tmp_path, settings=persistence_lines(tmp_path))
    await broker.start()
    try:
        async with ControlPublisher(
            login(broker.url, "operator"), TOPICS.cluster, origin="alice", secret=SECRET
        ) as operator:
            await operator.publish(SetStrategy("least-connections"))
        database = tmp_path / "mosquitto.db"
        await until(
            lambda: database.exists() and b"least-connections" in database.read_bytes(),
            what="the retained command saved",
        )
        await broker.kill()
        await broker.start()
        surface = ControlSurface(RouterCore(fleet()))
        link = ControlLink(
            surface, target=login(broker.url, "router"), backoff=quick_backoff(), secret=SECRET
        )
        await link.start()
        try:
            await until(
                lambda: surface.core.strategy.name == "least-connections",
                what="the command from the broker's saved retained messages",
            )
        finally:
            await link.stop()
        assert link.restored == 0  # no state file here: the broker kept it
    finally:
        await broker.stop()
