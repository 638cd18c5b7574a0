"""The console over the real in-process router (RouterServer on loopback), as
``gpurouter console`` runs it, and the command line's errors."""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

from console import console_command
from console.app import ConsoleApp
from console.router_host import LocalRouter
from console.screens.confirm import ConfirmScreen
from router.config.schema import ServerConfig
from router.replica import ReplicaState
from tests.fleet_factory import make_fleet


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
            assert host.server.control.audit[-1].actor == "console"
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
    args = argparse.Namespace(
        config=str(path), theme=None, read_only=False, refresh=None, no_telemetry=True
    )
    assert console_command.run(args, io.StringIO(), err) == 2
    assert "console.keys.drian: no such action" in err.getvalue()
