"""The console over the real in-process router (RouterServer on loopback), as
``gpurouter console`` runs it, and the command line's errors."""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from console import console_command
from console.app import ConsoleApp
from console.router_host import LocalRouter
from console.screens.confirm import ConfirmScreen
from console.widgets.header import DashboardHeader
from console.widgets.model_summary import ModelSummary
from router.config.schema import FleetConfig, HealthConfig, ServerConfig
from router.replica import ReplicaState
from tests.fleet_factory import make_fleet, served_behind


async def test_console_drives_the_router_it_runs() -> None:
    fleet = replace(
        make_fleet(), server=ServerConfig(listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
    )
    host = LocalRouter(fleet, telemetry=False)
    app = ConsoleApp(host.backend(), auto_refresh=False)
    await host.start()
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("d")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await pilot.pause()
            assert host.server.core.replica("r0").state is ReplicaState.DRAINED
            drain, *caused = list(host.server.control.audit)[-3:]
            assert (drain.kind, drain.actor) == ("drain", "console")
            assert [e.message for e in caused] == [
                "r0: active -> draining (by console)",
                "r0: draining -> drained (nothing left in flight)",
            ]
        assert any("router serving http://127.0.0.1:" in n for n in host.notes)
    finally:
        await host.stop()


def test_cli_names_a_bad_key_binding_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "cluster: c\nmodel: m\nnodes:\n  - name: n\n    gpus: [{index: 0, model: L4, "
        "memory_gib: 24}]\n    replicas: [{id: a, endpoint: 'http://127.0.0.1:1', gpus: [0]}]\n"
        "console:\n  keys: {drian: x}\n"
    )
    err = io.StringIO()
    parser = argparse.ArgumentParser()
    console_command.add_arguments(parser)  # every flag's default, as the command line gives
    args = parser.parse_args(["--config", str(path), "--no-telemetry"])
    assert console_command.run(args, io.StringIO(), err) == 2
    assert "console.keys.drian: no such action" in err.getvalue()


def test_cli_refuses_a_token_variable_that_is_not_set_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "cluster: c\nmodel: m\nnodes:\n  - name: n\n    gpus: [{index: 0, model: L4, "
        "memory_gib: 24}]\n    replicas: [{id: a, endpoint: 'http://127.0.0.1:1', gpus: [0]}]\n"
        "server: {admin_listen: '127.0.0.1:0', admin_token_env: GPUROUTER_UNSET_TOKEN}\n"
    )
    monkeypatch.delenv("GPUROUTER_UNSET_TOKEN", raising=False)
    err = io.StringIO()
    parser = argparse.ArgumentParser()
    console_command.add_arguments(parser)
    args = parser.parse_args(["--config", str(path), "--no-telemetry"])
    assert console_command.run(args, io.StringIO(), err) == 2
    assert "server.admin_token_env: names the environment variable GPUROUTER_UNSET_TOKEN" in (
        err.getvalue()
    )


def fleet_with_nothing_behind() -> FleetConfig:
    # No timer: the test runs the health checks itself, so nothing depends on time.
    return served_behind(make_fleet(), HealthConfig(check_interval_s=0.0, eject_after_failures=5))


async def test_a_console_with_nothing_behind_the_endpoints_says_so_everywhere() -> None:
    """As `gpurouter console` on a fleet file whose replicas were never started: once the
    health checks have failed, every row says failing, the header says no replica is up,
    the GPU-models pane counts none up, and /ready is 503."""
    host = LocalRouter(fleet_with_nothing_behind(), telemetry=False)
    app = ConsoleApp(host.backend(), auto_refresh=False)
    await host.start()
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await host.server.health.check()
            app.refresh_data()
            await pilot.pause()
            header = app.query_one(DashboardHeader).plain
            models = app.query_one(ModelSummary).plain
            states = {row.state for row in app.last_rows}
            async with httpx.AsyncClient(base_url=host.server.front_url) as http:
                ready = await http.get("/ready")
    finally:
        await host.stop()
    assert states == {"failing"}
    assert "imbalance — ✖ no replica up: 4 failing" in header
    assert "excellent" not in header
    assert [row[1] for row in models] == ["0/2", "0/2"]
    assert [row[5] for row in models] == ["✖ none up", "✖ none up"]
    assert ready.status_code == 503
