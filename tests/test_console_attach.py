"""``gpurouter console --attach URL``: the real console on a real router serving its admin API
on loopback, read and steered through that API alone; read-only without a token; a wrong
URL or token is one clear error at start."""

from __future__ import annotations

import argparse
import asyncio
import io
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest

from console import console_command
from console.app import ConsoleApp
from console.attach.backend import NO_TOKEN, RemoteBackend, attach
from console.ctl.errors import AuthFailedError
from console.screens.confirm import ConfirmScreen
from console.widgets.events_pane import EventsPane
from console.widgets.fleet_table import FleetTable
from console.widgets.header import DashboardHeader
from router.config.schema import ServerConfig
from router.control import Event
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.fleet_factory import make_fleet

TOKEN = "attach-token"
SIZE = (120, 32)


@asynccontextmanager
async def serving(token: str | None) -> AsyncIterator[RouterServer]:
    """The router `gpurouter serve` runs (front door and admin API), on loopback ports."""
    fleet = replace(
        make_fleet(), server=ServerConfig(listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
    )
    server = RouterServer(fleet, admin_token=token)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0)


@asynccontextmanager
async def attached(server: RouterServer, token: str | None) -> AsyncIterator[RemoteBackend]:
    assert server.admin_url is not None
    backend = await attach(server.admin_url, token=token, actor="attached-console:test")
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def toasts(app: ConsoleApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def arrival(backend: RemoteBackend, kind: str) -> asyncio.Event:
    """Set once an event of ``kind`` came down the attached router's event stream."""
    seen = asyncio.Event()

    def listener(event: Event) -> None:
        if event.kind == kind:
            seen.set()

    backend.subscribe(listener)
    return seen


async def test_attached_console_shows_the_remote_replicas_and_its_drain_is_applied_there() -> None:
    async with serving(TOKEN) as server, attached(server, TOKEN) as backend:
        drained = await arrival(backend, "drain")
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            shown = [r.replica for r in app.query_one(FleetTable).rows_shown if r.replica]
            assert shown == ["r0", "r1", "r2", "r3"]
            assert f"attached to {server.admin_url}" in "\n".join(
                app.query_one(EventsPane).lines_written
            )
            await pilot.press("d")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await app.workers.wait_for_complete()
            assert server.core.replica("r0").state is ReplicaState.DRAINED
            command = next(e for e in server.control.audit if e.kind == "drain")
            assert (command.actor, command.ok) == ("attached-console:test", True)
            await asyncio.wait_for(drained.wait(), timeout=10)
            await pilot.pause()
            written = app.query_one(EventsPane).lines_written
            assert any("drain" in line and "attached-console:test" in line for line in written)
            assert any("r0: draining" in t for t in toasts(app))
            await backend.poll()
            app.refresh_data()
            assert app.last_snapshot is not None
            r0 = next(r for r in app.last_snapshot.replicas if r.id == "r0")
            assert r0.state == "drained"


async def test_attached_console_switches_the_remote_strategy_from_the_palette_action() -> None:
    async with serving(TOKEN) as server, attached(server, TOKEN) as backend:
        switched = await arrival(backend, "strategy")
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE):
            app.switch_strategy("round-robin")
            await app.workers.wait_for_complete()
            assert server.core.strategy.name == "round-robin"
            await asyncio.wait_for(switched.wait(), timeout=10)


async def test_attached_without_a_token_every_command_key_says_why_and_sends_nothing() -> None:
    async with serving(None) as server, attached(server, None) as backend:
        app = ConsoleApp(backend, auto_refresh=False)
        async with app.run_test(size=SIZE) as pilot:
            assert "READ-ONLY" in app.query_one(DashboardHeader).plain
            for key in ("d", "u", "p", "e", "r", "s", "w", "b"):
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen)
            app.switch_strategy("round-robin")
            await app.workers.wait_for_complete()
            refused = {t.removeprefix(NO_TOKEN + ": ") for t in toasts(app) if NO_TOKEN in t}
            actions = ("drain", "undrain", "preempt", "eject", "readmit", "strategy", "weight")
            assert refused == {f"{what} refused" for what in (*actions, "batch")}
            assert "set GPUROUTER_ADMIN_TOKEN to steer" in NO_TOKEN
        assert server.core.replica("r0").state is ReplicaState.ACTIVE
        assert server.core.strategy.name == "weighted-least-connections"
        assert list(server.control.audit) == []


async def test_a_wrong_token_is_refused_at_attach() -> None:
    async with serving(TOKEN) as server:
        assert server.admin_url is not None
        with pytest.raises(AuthFailedError, match="refused the token"):
            await attach(server.admin_url, token="wrong", actor="t")
        with pytest.raises(AuthFailedError, match="needs a token: set GPUROUTER_ADMIN_TOKEN"):
            await attach(server.admin_url, token=None, actor="t")


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    console_command.add_arguments(parser)
    err = io.StringIO()
    code = console_command.run(parser.parse_args(argv), io.StringIO(), err)
    return code, err.getvalue()


def test_cli_with_a_wrong_token_exits_4_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUROUTER_ADMIN_TOKEN", "wrong")

    async def check() -> tuple[int, str]:
        # The CLI runs its own loop: on another thread, while the router serves on this one.
        async with serving(TOKEN) as server:
            assert server.admin_url is not None
            return await asyncio.to_thread(run_cli, ["--attach", server.admin_url])

    code, err = asyncio.run(check())
    assert code == 4
    assert err.startswith("gpurouter console: error: ")
    assert "refused the token" in err


def test_cli_with_nothing_listening_exits_3_and_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    code, err = run_cli(["--attach", f"127.0.0.1:{port}"])
    assert code == 3
    assert f"cannot connect to http://127.0.0.1:{port}" in err


def test_cli_refuses_hosting_options_with_attach() -> None:
    code, err = run_cli(["--attach", "127.0.0.1:1", "--no-telemetry"])
    assert code == 2
    assert "--no-telemetry: only with --config" in err
