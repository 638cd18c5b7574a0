"""A router that restarts numbers its events from 1 again: the attached console's event
stream starts over in the router's new run and shows its events, and the events pane says
the router restarted. A real router serves its admin API on loopback, stops, and a new one
serves on the same port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

from console.app import ConsoleApp
from console.attach.backend import RemoteBackend, attach
from console.widgets.events_pane import EventsPane
from router.config.schema import ServerConfig
from router.control import Drain, Event, Undrain
from router.http.server import RouterServer
from tests.fleet_factory import make_fleet

TOKEN = "restart-token"
WAIT_S = 30.0
"""Bound on waiting for a condition; reaching it is a failure, never a pass."""


@asynccontextmanager
async def serving(admin_port: int = 0) -> AsyncIterator[RouterServer]:
    fleet = replace(
        make_fleet(),
        server=ServerConfig(listen="127.0.0.1:0", admin_listen=f"127.0.0.1:{admin_port}"),
    )
    server = RouterServer(fleet, admin_token=TOKEN)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0)


def arrival(backend: RemoteBackend, wanted: Callable[[Event], bool]) -> asyncio.Event:
    """Set once an event ``wanted`` came down the attached router's event stream."""
    seen = asyncio.Event()
    backend.subscribe(lambda e: seen.set() if wanted(e) else None)
    return seen


def drain_of(replica: str) -> Callable[[Event], bool]:
    return lambda e: e.kind == "drain" and e.args.get("replica") == replica


async def test_a_router_restarted_on_the_same_port_shows_its_new_events() -> None:
    """The first router's trail runs past the restarted one's numbers, so a stream resumed
    after the old numbers would show nothing new."""
    first = serving()
    server = await first.__aenter__()
    port = int(server.admin_url.rsplit(":", 1)[1])
    backend = await attach(server.admin_url, token=TOKEN, actor="attached-console:test")
    try:
        await backend.start()
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=(120, 32)) as pilot:
            last = arrival(backend, drain_of("r1"))
            for command in (Drain("r0"), Undrain("r0"), Drain("r1")):
                server.control.apply(command, actor="test")
            await asyncio.wait_for(last.wait(), WAIT_S)
            await first.__aexit__(None, None, None)
            async with serving(port) as second:
                new = arrival(backend, drain_of("r2"))
                event = second.control.apply(Drain("r2"), actor="test")
                assert event.seq < backend.cursor.since  # numbered from 1 again
                await asyncio.wait_for(new.wait(), WAIT_S)
                app.refresh_data()
                await pilot.pause()
                written = "\n".join(app.query_one(EventsPane).lines_written)
                assert f"router restarted: {second.admin_url}" in written
                assert "r2" in written.split("router restarted")[-1]
                assert {e.args.get("replica") for e in backend.audit()} == {"r2"}  # new run only
    finally:
        await backend.stop()
        await first.__aexit__(None, None, None)
