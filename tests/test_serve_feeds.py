"""``gpurouter serve`` hears MQTT: it applies the operators' signed commands, drops forged
ones and counts them on /metrics and in the admin state, and a command given to one router's
admin API is applied by every router (on the embedded broker and on Mosquitto)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from console import cli
from router.config.schema import BrokerConfig
from router.control import ControlSurface, SetWeight
from router.core import RouterCore
from router.emulator import EmulatedFleet
from router.telemetry.connection import resolve_target
from router.telemetry.control_publisher import ControlPublisher
from router.telemetry.control_topics import ControlLink, NotLinkedError
from router.telemetry.feeds import RouterFeeds
from tests.http_support import Spec
from tests.mqtt_fixtures import Broker
from tests.telemetry_helpers import fleet, target
from tests.test_emulator_support import any_ports, fleet_config
from tests.test_http_serve import fleet_yaml, read_line

SPECS = (Spec("a"), Spec("b"))
SECRET = "serve-feeds-secret-0123456789"


async def weight_of(client: httpx.AsyncClient, admin: str, replica: str, want: float) -> float:
    """The replica's weight once it is ``want`` (bounded wait), else the last one read."""
    weight = -1.0
    for _ in range(300):
        state = (await client.get(admin + "/admin/state")).json()
        weight = next(r["weight"] for r in state["replicas"] if r["id"] == replica)
        if weight == want:
            break
        await asyncio.sleep(0.02)
    return weight


async def _serve(fleet: Path, secret: str) -> tuple[asyncio.subprocess.Process, str, str]:
    """``gpurouter serve`` on ``fleet`` with its control secret: the process, its front door
    and admin API, once its control link started (signed)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console.cli", "serve", "--workers", "1", "--config", str(fleet),
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "SERVE_FEEDS_SECRET": secret},
    )  # fmt: skip
    assert proc.stdout is not None
    front = await read_line(proc.stdout, "front door on")
    admin = await read_line(proc.stdout, "admin API on")
    assert await read_line(proc.stdout, "control link as") == "commands)"  # "(signed commands)"
    return proc, front, admin


async def test_serve_applies_signed_commands_and_counts_forged_ones(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        text = fleet_yaml(emulated) + f"broker: {{url: '{mqtt_broker.url}'}}\n"
        fleet.write_text(text + "control: {secret_env: SERVE_FEEDS_SECRET}\n")
        proc, front, admin = await _serve(fleet, SECRET)
        try:
            target = resolve_target(BrokerConfig(), url=mqtt_broker.url)
            async with ControlPublisher(target, "serve-test", origin="mallory") as forger:
                await forger.publish(SetWeight("a", 9.0))
            async with ControlPublisher(
                target, "serve-test", origin="alice", secret=SECRET.encode()
            ) as operator:
                await operator.publish(SetWeight("b", 3.0))
            async with httpx.AsyncClient(timeout=10) as client:
                assert await weight_of(client, admin, "b", 3.0) == 3.0
                assert await weight_of(client, admin, "a", 1.0) == 1.0
                state = (await client.get(admin + "/admin/state")).json()
                metrics = (await client.get(front + "/metrics")).text
            assert state["telemetry"]["control"]["refused"]["unsigned"] == 1
            assert 'gpurouter_control_dropped_total{reason="unsigned"} 1.0' in metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0


async def _knows_routers(client: httpx.AsyncClient, admin: str, n: int) -> None:
    """Wait (bounded) until the router has heard from ``n`` routers, itself included."""
    for _ in range(500):
        state = (await client.get(admin + "/admin/state")).json()
        if len(state["telemetry"]["control"]["routers"]) >= n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the router never heard from {n} routers")


async def test_a_command_given_to_one_router_is_applied_by_every_router(
    tmp_path: Path, mqtt_broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `serve` processes on one broker: a drain and a weight sent to one router's admin
    API are published as desired state, and both routers apply them."""
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        text = fleet_yaml(emulated) + f"broker: {{url: '{mqtt_broker.url}'}}\n"
        fleet.write_text(text + "control: {secret_env: SERVE_FEEDS_SECRET}\n")
        routers = [await _serve(fleet, SECRET) for _ in range(2)]
        try:
            (_, _, admin_a), (_, _, admin_b) = routers
            async with httpx.AsyncClient(timeout=10) as client:
                for admin in (admin_a, admin_b):
                    await _knows_routers(client, admin, 2)
                answer = await client.post(
                    admin_a + "/admin/commands",
                    json={"command": "weight", "replica": "b", "weight": 4.0},
                    headers={"X-Actor": "alice"},
                )
                assert answer.status_code == 200
                assert answer.json()["actor"].startswith("mqtt:alice@router-")
                # Both routers acknowledged it (each publishes stats every second).
                assert sorted(answer.json()["applied_by"].values()) == [True, True]
                assert await weight_of(client, admin_b, "b", 4.0) == 4.0
                assert await weight_of(client, admin_a, "b", 4.0) == 4.0
                events = (await client.get(admin_b + "/admin/events")).json()["events"]
            applied = [e for e in events if e["kind"] == "weight"]
            assert [e["actor"] for e in applied] == [answer.json()["actor"]]
            # `gpurouter ctl` says which routers applied a command.
            code = await asyncio.to_thread(cli.main, ["ctl", "--admin", admin_b, "drain", "a"])
            lines = capsys.readouterr().out.splitlines()
            assert code == 0
            assert lines[-1].startswith("applied by 2 router(s): router-")
        finally:
            for proc, _, _ in routers:
                proc.send_signal(signal.SIGTERM)
            for proc, _, _ in routers:
                assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_with_the_control_link_down_a_command_is_applied_on_this_router_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No broker answers: the link cannot publish, so the admin API's command is applied
    here, and the log says that it reached no other router."""
    config = dataclasses.replace(fleet(), broker=BrokerConfig(url="mqtt://127.0.0.1:1"))
    surface = ControlSurface(RouterCore(config))
    feeds = RouterFeeds(config, surface)
    feeds.link = ControlLink(surface, target=target("mqtt://127.0.0.1:1"))
    with pytest.raises(NotLinkedError):
        await feeds.link.publish_command(SetWeight("h100-0", 2.0), "alice")
    applied = await feeds.apply(SetWeight("h100-0", 2.0), "alice")
    assert (applied.event.ok, applied.event.actor, applied.routers) == (True, "alice", None)
    assert surface.core.replica("h100-0").weight == 2.0
    assert "weight applied on this router only" in caplog.text
