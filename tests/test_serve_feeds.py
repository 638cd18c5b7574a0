"""``gpurouter serve`` hears MQTT: it applies the operators' signed commands, drops forged
ones and counts them on /metrics and in the admin state (on the embedded broker and on
Mosquitto)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from router.config.schema import BrokerConfig
from router.control import SetWeight
from router.emulator import EmulatedFleet
from router.telemetry.connection import resolve_target
from router.telemetry.control_publisher import ControlPublisher
from tests.http_support import Spec
from tests.mqtt_fixtures import Broker
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


async def test_serve_applies_signed_commands_and_counts_forged_ones(
    tmp_path: Path, mqtt_broker: Broker
) -> None:
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        text = fleet_yaml(emulated) + f"broker: {{url: '{mqtt_broker.url}'}}\n"
        fleet.write_text(text + "control: {secret_env: SERVE_FEEDS_SECRET}\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "serve", "--config", str(fleet),
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "SERVE_FEEDS_SECRET": SECRET},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            front = await read_line(proc.stdout, "front door on")
            admin = await read_line(proc.stdout, "admin API on")
            link = await read_line(proc.stdout, "control link as")
            assert link == "commands)"  # "... (signed commands)"
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
