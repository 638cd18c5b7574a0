"""Helpers for the console's rollout tests (no tests here): a router in front of emulated
replicas whose fleet file names a real updater (the emulator's version switch, reached over
HTTP, or held behind a gate the test opens), and the console's backend for it, in-process
or attached through the admin API."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from console.app import ConsoleApp
from console.attach.backend import RemoteBackend, attach
from console.backend import Backend, ConsoleBackend
from router.config.schema import (
    CommandUpdaterConfig,
    HttpUpdaterConfig,
    RolloutConfig,
    UpdaterConfig,
)
from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from tests.http_support import MODEL, Spec, routed_fleet
from tests.test_emulator_support import any_ports, fleet_config

__all__ = ["NEW", "SPECS", "TOKEN", "backend_for", "refreshed", "rolling"]

SPECS = (Spec("a0"), Spec("v0", gpu="V100-32GB"), Spec("v1", gpu="V100-32GB"))
NEW = "Llama-3.1-8B-v2"
TOKEN = "rollout-console-token"
BODY = f'{{"version": "{{version}}", "load_s": 1, "aliases": ["{MODEL}"]}}'
"""The emulator's version switch: the new name, served beside the fleet's (docs/rollouts.md)."""

GATED = """\
import json, os, sys, time, urllib.request
gate, url, version, alias = sys.argv[1:5]
give_up = time.monotonic() + 120  # a test that ends without opening it leaves no process
while not os.path.exists(gate):  # held until the test opens the gate
    if time.monotonic() > give_up:
        sys.exit("the gate never opened")
    time.sleep(0.01)
body = json.dumps({"version": version, "load_s": 1, "aliases": [alias]}).encode()
headers = {"Content-Type": "application/json"}
urllib.request.urlopen(urllib.request.Request(url, body, headers, method="POST"), timeout=10)
"""
"""An update command that waits for a file, then asks the emulator to switch: a rollout held
in its first wave's update for as long as a test needs, with nothing timed."""


def _updater(control_port: int, gate: Path | None) -> UpdaterConfig:
    url = f"http://127.0.0.1:{control_port}/versions/{{replica}}"
    if gate is None:
        return UpdaterConfig(http=HttpUpdaterConfig(url=url, body=BODY, expect_status=202))
    script = gate.with_name("gated_update.py")
    script.write_text(GATED)
    run = f"{sys.executable} {script} {gate} {url} {{version}} {MODEL}"
    return UpdaterConfig(command=CommandUpdaterConfig(run=run, timeout_s=60))


@asynccontextmanager
async def rolling(
    *, token: str | None = None, gate: Path | None = None
) -> AsyncIterator[tuple[RouterServer, EmulatedFleet]]:
    """Emulated replicas (an A100, two V100s) behind a started router whose fleet file's
    ``rollout:`` updates them through the emulator (behind ``gate`` when given)."""
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=100.0, ports=any_ports(SPECS)) as emulated:
        port = await emulated.start_control()
        rollout = RolloutConfig(check_interval_s=0.01, updater=_updater(port, gate))
        fleet = dataclasses.replace(routed_fleet(config, emulated), rollout=rollout)
        server = RouterServer(
            fleet, listen="127.0.0.1:0", admin_listen="127.0.0.1:0", admin_token=token
        )
        await server.start()
        try:
            yield server, emulated
        finally:
            await server.stop(grace_s=0)


@asynccontextmanager
async def backend_for(
    kind: str, server: RouterServer, token: str | None = TOKEN
) -> AsyncIterator[Backend]:
    """``local``: the router in the console's process; ``attached``: the same router through
    its admin API (read-only without ``token``)."""
    if kind == "local":
        yield ConsoleBackend(server.core, server.control, rollouts=server.rollouts)
        return
    assert server.admin_url is not None
    remote = await attach(server.admin_url, token=token, actor="attached-console:test")
    await remote.start()
    try:
        yield remote
    finally:
        await remote.stop()


async def refreshed(app: ConsoleApp) -> None:
    """One refresh of the console, with the attached router asked first (its poller runs on
    a timer a test does not wait for)."""
    if isinstance(app.backend, RemoteBackend):
        await app.backend.poll()
    app.refresh_data()
