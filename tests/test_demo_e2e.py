"""``gpurouter demo --headless`` end to end, as a user runs it: a child process, and its own
children, the embedded broker, the lab (emulated fleet, node agents, load) and the router; a
strategy switch from ``gpurouter ctl`` with the token the banner shows; Ctrl+C (SIGINT);
nothing left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.demo_cli import (
    ROOT,
    WAIT_S,
    banner,
    demo_process,
    lab_children,
    next_line,
    router_children,
)
from tests.demo_helpers import alive, children, free_port, port_free, two_node_fleet

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads children from /proc")


async def ctl(admin: str, token: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "console.cli",
        "ctl",
        "--admin",
        admin,
        *args,
        cwd=ROOT,
        env={**os.environ, "GPUROUTER_ADMIN_TOKEN": token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def telemetry_arrived(line: dict[str, Any]) -> bool:
    nodes = line["telemetry"]["nodes"].values()
    fresh = bool(nodes) and all(n["fresh"] and n["samples"] > 0 for n in nodes)
    return fresh and any(r["utilization_from_telemetry"] for r in line["replicas"].values())


async def test_demo_headless_routes_reports_telemetry_switches_and_stops_clean(
    tmp_path: Path,
) -> None:
    """Requests flow through the front door to the emulated replicas, MQTT telemetry reaches
    the router, a ctl strategy switch (with the token; refused
    without) shows in the lines that follow, and Ctrl+C stops it all: exit
    0, nothing lost, the broker child reaped, every port free again."""
    replica_ports = (free_port(), free_port())
    async with demo_process(two_node_fleet(tmp_path, replica_ports)) as proc:
        urls = await banner(proc)
        demo_children = children(proc.pid)
        assert len(demo_children) >= 3, "the broker, the lab and the router run in children"
        assert len(lab_children(proc.pid)) == 1
        assert len(router_children(proc.pid)) == 1

        line = await next_line(proc)
        assert line["strategy"] == "round-robin"  # whatever the fleet file says
        while not (telemetry_arrived(line) and line["client"].get("completed", 0) > 0):
            line = await next_line(proc)
        assert line["telemetry"]["broker"] == "connected"
        assert set(line["replicas"]) == {"a100-0", "v100-0"}

        code, said = await ctl(urls["admin API"], "", "strategy", "round-robin")
        assert code != 0, "the demo's admin API needs its token"
        code, said = await ctl(
            urls["admin API"], urls["token"], "strategy", "weighted-least-connections"
        )
        assert code == 0, said
        # Lines printed while ctl ran may still wait in the pipe: the switch shows after them
        # (the run's --duration bounds the wait).
        line = await next_line(proc)
        while line.get("strategy") == "round-robin":
            line = await next_line(proc)
        assert line.get("strategy") == "weighted-least-connections"

        proc.send_signal(signal.SIGINT)
        summary = (await next_line(proc))["summary"]
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0

    assert summary["outcomes"]["completed"] > 0
    assert "stopped" in summary["outcomes"]  # what the stop cut off is not counted failed
    assert summary["client"]["completed"] > 0
    assert summary["lost"] == 0
    assert [s["strategy"] for s in summary["strategy_switches"]] == ["weighted-least-connections"]
    assert not [pid for pid in demo_children if alive(pid)]
    front, admin = (int(urls[k].rsplit(":", 1)[1]) for k in ("front door", "admin API"))
    broker = int(urls["telemetry"].rsplit(":", 1)[1])
    for port in (*replica_ports, front, admin, broker):
        assert port_free(port), f"port {port} is still taken"
