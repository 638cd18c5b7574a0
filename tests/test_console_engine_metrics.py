"""The console shows what the router could not take from the engines' own /metrics: a page it
could not read, and values it refused as nonsense. A real router on loopback polls a real
HTTP engine page (one replica's carries a KV usage of 7, the others' endpoints are closed),
and the real console, in the router's process and attached to it, says so in its header
and its events pane."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from console.app import ConsoleApp
from console.attach.backend import RemoteBackend, attach
from console.router_host import LocalRouter
from console.widgets.events_pane import EventsPane
from console.widgets.header import DashboardHeader
from router.config.schema import FleetConfig, HealthConfig
from router.http.server import RouterServer
from tests.fleet_factory import make_fleet, served_behind

NONSENSE_PAGE = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 7.0
"""
SIZE = (160, 32)


@asynccontextmanager
async def engine_page(text: str) -> AsyncIterator[str]:
    """An engine's /metrics on a loopback port; yields its base URL."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def fleet_behind(url: str) -> FleetConfig:
    """r0 at ``url``; r1-r3 at closed ports. No timers: the test polls and refreshes."""
    health = HealthConfig(check_interval_s=0.0, engine_metrics_interval_s=0.0)
    return served_behind(make_fleet(), health, {"r0": url})


async def shows_the_engines_troubles(
    app: ConsoleApp, server: RouterServer, remote: RemoteBackend | None = None
) -> tuple[str, list[str]]:
    """Refresh once with nothing polled, poll the engines, refresh again: the header's third
    line and the alerts written between the two."""
    async with app.run_test(size=SIZE) as pilot:
        app.refresh_data()
        before = len(app.query_one(EventsPane).lines_written)
        await server.engine_metrics.poll_once()
        if remote is not None:
            await remote.poll()  # what its timer does: read the admin state again
        app.refresh_data()
        await pilot.pause()
        header = app.query_one(DashboardHeader).plain
        written = app.query_one(EventsPane).lines_written[before:]
    return header, written


def assert_shown(header: str, written: list[str]) -> None:
    assert "✖ engine /metrics unreadable: 3 replicas" in header
    assert "⚠ engine /metrics refused values: r0" in header
    alerts = "\n".join(written)
    for replica in ("r1", "r2", "r3"):
        assert f"✖ {replica}: engine /metrics unreadable: http://127.0.0.1:" in alerts
    assert "⚠ r0: engine /metrics value refused, last good kept: kv_usage: 7.0 outside" in alerts


async def test_the_console_in_the_routers_process_shows_unreadable_and_refused_pages() -> None:
    async with engine_page(NONSENSE_PAGE) as url:
        host = LocalRouter(fleet_behind(url), telemetry=False)
        app = ConsoleApp(host.backend(), auto_refresh=False)
        await host.start()
        try:
            header, written = await shows_the_engines_troubles(app, host.server)
        finally:
            await host.stop()
    assert_shown(header, written)


async def test_an_attached_console_shows_them_from_the_admin_state() -> None:
    async with engine_page(NONSENSE_PAGE) as url:
        server = RouterServer(fleet_behind(url))
        await server.start()
        try:
            assert server.admin_url is not None
            backend = await attach(server.admin_url, token=None, actor="attached-console:test")
            await backend.start()
            try:
                app = ConsoleApp(backend, auto_refresh=False)
                header, written = await shows_the_engines_troubles(app, server, backend)
            finally:
                await backend.stop()
        finally:
            await server.stop(grace_s=0)
    assert_shown(header, written)
