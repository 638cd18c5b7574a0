"""``gpurouter console --broker URL``: a router publishing its stats the way `gpurouter serve`
does and a node agent publishing its GPUs, on a real broker on loopback; the console watching
that broker shows the router (strategy, load, the commands it applied) and the node's GPUs,
and counts what it dropped. Alone it is read-only; beside an attached router, the GPUs'
telemetry comes from the broker. Every wait polls a condition, bounded."""

from __future__ import annotations

import argparse
import dataclasses
import io
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from console import console_command
from console.actions import visible
from console.app import ConsoleApp
from console.attach.backend import attach
from console.cluster.app import BROKER_ONLY, ClusterApp
from console.cluster.screen import ClusterScreen
from console.cluster.watch import ClusterWatch
from console.screens.help import HelpScreen
from router.config.schema import BrokerConfig, FleetConfig, ServerConfig
from router.control import SetWeight
from router.http.server import RouterServer
from router.telemetry.connection import make_client, publish
from router.telemetry.feeds import RouterFeeds
from router.telemetry.topics import Topics
from tests.console_helpers import loaded_rig
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import emulated_agent, fleet, running, target

ROUTER = "router-a"
NODE = "h100-node"
SIZE = (160, 40)


def fleet_on(url: str) -> FleetConfig:
    return dataclasses.replace(
        fleet(),
        broker=BrokerConfig(url=url, sample_period_s=0.1, keepalive_s=5),
        server=ServerConfig(listen="127.0.0.1:0", admin_listen="127.0.0.1:0"),
    )


@asynccontextmanager
async def serve_like(config: FleetConfig, *, feeds: bool = True) -> AsyncIterator[RouterServer]:
    """The router `gpurouter serve` runs: front door, admin API and (``feeds``) its MQTT
    feeds, whose control link publishes the router's stats and acknowledgements."""
    server = RouterServer(config)
    router_feeds = RouterFeeds(config, server.control, router_id=ROUTER) if feeds else None
    await server.start()
    try:
        if router_feeds is not None:
            await router_feeds.start()
            server.admin.apply = router_feeds.apply
        yield server
    finally:
        if router_feeds is not None:
            await router_feeds.stop()
        await server.stop(grace_s=0)


async def publish_junk(url: str, cluster: str) -> None:
    """A stats message that is not JSON and a GPU batch of the wrong shape."""
    topics = Topics(cluster)
    async with make_client(target(url), identifier="junk-publisher") as client:
        await publish(client, topics.router_stats("router-junk"), b"{not json", qos=1)
        await publish(client, topics.gpus(NODE), b'{"v": 1, "node": 7}', qos=1)


def row_of(rows: list[tuple[str, ...]], first: str) -> tuple[str, ...] | None:
    return next((r for r in rows if r[0] == first), None)


def showing(screen: ClusterScreen, check: Callable[[ClusterScreen], bool]) -> Callable[[], bool]:
    """Redraw the screen from the feeds, then check what it shows."""

    def redraw_and_check() -> bool:
        screen.refresh_view()
        return check(screen)

    return redraw_and_check


def router_applied(n: int) -> Callable[[ClusterScreen], bool]:
    def check(screen: ClusterScreen) -> bool:
        row = row_of(screen.routers_shown, ROUTER)
        return row is not None and row[8] == f"{n} applied, 0 refused"

    return check


def gpus_read(screen: ClusterScreen) -> bool:
    return any(r[0] == NODE and r[1] == "online" and r[5] != "—" for r in screen.nodes_shown)


async def test_broker_alone_shows_the_routers_and_nodes_and_counts_what_it_dropped(
    mqtt_broker: Broker,
) -> None:
    config = fleet_on(mqtt_broker.url)
    agent = emulated_agent(config, NODE, mqtt_broker.url)
    async with serve_like(config) as server, running(agent):
        # What `--broker URL --cluster NAME` builds: no fleet file, the cluster's name only.
        watch = ClusterWatch(mqtt_broker.url, FleetConfig(nodes=(), cluster=config.cluster))
        await watch.start()
        try:
            app = ClusterApp(watch, live=False)
            async with app.run_test(size=SIZE) as pilot:
                screen = app.screen
                assert isinstance(screen, ClusterScreen)
                await until(showing(screen, router_applied(0)), what="the router's stats")
                await until(showing(screen, gpus_read), what="the node's GPUs")
                row = row_of(screen.routers_shown, ROUTER)
                assert row is not None
                assert row[1:4] == ("weighted-least-connections", "0", "0/1024")
                assert row[6] == f"{len(config.replicas)}/{len(config.replicas)} active"
                # A command given to the router's admin API is published to the cluster,
                # applied and acknowledged: the watch sees which.
                await server.admin.apply(SetWeight("h100-0", 2.0), "alice")
                await until(showing(screen, router_applied(1)), what="the router's ack")
                row = row_of(screen.routers_shown, ROUTER)
                assert row is not None
                assert row[9] == "weight/h100-0 applied"

                def event_shown(s: ClusterScreen) -> bool:
                    return any(
                        r[0] == ROUTER and "mqtt:alice@router-a: h100-0: weight" in r[1]
                        for r in s.events_shown
                    )

                await until(showing(screen, event_shown), what="the router's audit event")
                await publish_junk(mqtt_broker.url, config.cluster)

                def junk_counted(s: ClusterScreen) -> bool:
                    return "telemetry 1 (malformed 1)" in s.summary_shown and (
                        "routers 1 (malformed_stats 1)" in s.summary_shown
                    )

                await until(showing(screen, junk_counted), what="the junk counted")
                assert row_of(screen.routers_shown, "router-junk") is None
                assert screen.summary_shown.startswith(f"broker {mqtt_broker.url} connected")
                await pilot.press("d")
                await pilot.pause()
                messages = [str(n.message) for n in app._notifications]
                assert messages == [f"{BROKER_ONLY}: drain refused"]
        finally:
            await watch.stop()
    assert server.core.replica("h100-0").weight == 2.0  # only the admin API steered it


async def test_attached_with_a_broker_shows_the_gpus_from_it_and_the_cluster_screen(
    mosquitto: Broker,
) -> None:
    """The attached router runs without telemetry (its admin state carries none); the
    broker carries the node's GPUs and another router's stats."""
    config = fleet_on(mosquitto.url)
    agent = emulated_agent(config, NODE, mosquitto.url)
    async with (
        serve_like(config, feeds=False) as attached_router,
        serve_like(config),
        running(agent),
    ):
        assert attached_router.admin_url is not None
        backend = await attach(attached_router.admin_url, token=None, actor="t")
        backend.cluster = ClusterWatch(mosquitto.url, backend.fleet)
        await backend.start()
        try:
            app = ConsoleApp(backend, auto_refresh=False)
            async with app.run_test(size=SIZE) as pilot:

                def gpus_from_the_broker() -> bool:
                    app.refresh_data()
                    rows = app.last_rows
                    return any(r.node == NODE and r.telemetry and r.util_fresh for r in rows)

                await until(gpus_from_the_broker, what="the GPUs' telemetry in the fleet table")
                await pilot.press("c")
                await pilot.pause()
                screen = app.screen
                assert isinstance(screen, ClusterScreen)
                await until(showing(screen, router_applied(0)), what="the cluster's router")
                await pilot.press("escape")
                await pilot.pause()
                assert not isinstance(app.screen, ClusterScreen)
        finally:
            await backend.stop()


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    console_command.add_arguments(parser)
    err = io.StringIO()
    code = console_command.run(parser.parse_args(argv), io.StringIO(), err)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "one of --config, --attach or --broker is required"),
        (["--config", "f.yaml", "--broker", "mqtt://127.0.0.1:1"], "--broker: with --attach"),
        (["--broker", "mqtt://127.0.0.1:1", "--listen", "127.0.0.1:0"], "--listen: only with"),
        (["--attach", "127.0.0.1:1", "--cluster", "c"], "--cluster: only with --broker alone"),
        (["--broker", "http://127.0.0.1:1"], "mqtt"),
        (["--broker", "mqtt://127.0.0.1:1", "--cluster", "a/b"], "cannot be an MQTT topic"),
    ],
)
def test_cli_refuses_what_a_broker_console_cannot_do(argv: list[str], message: str) -> None:
    code, err = run_cli(argv)
    assert code == 2
    assert err.startswith("gpurouter console: ")
    assert message in err


async def test_a_console_watching_no_broker_offers_no_cluster_screen() -> None:
    """In process (or attached without --broker) ``c`` is no key of the console's and the
    help lists no cluster action: at 80x24 the help keeps every key on one screen."""
    app = ConsoleApp(loaded_rig().backend, auto_refresh=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, ClusterScreen)
        assert "cluster" not in {a.id for a in visible(read_only=False)}
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert "cluster" not in {a.id for a in app.screen.actions}
