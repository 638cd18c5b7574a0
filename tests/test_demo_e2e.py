"""``gpurouter demo --headless`` end to end, as a user runs it: a child process with the
embedded broker, the emulated fleet, node agents, the router and its load; a strategy
switch from ``gpurouter ctl``; Ctrl+C (SIGINT); nothing left behind."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.demo_helpers import free_port, port_free, two_node_fleet

ROOT = Path(__file__).resolve().parent.parent
_WAIT_S = 60.0
"""Guard against a hang only (the run takes a few seconds)."""

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads children from /proc")


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the fields follow it.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@asynccontextmanager
async def demo_process(fleet: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "console.cli",
        "demo",
        "--headless",
        "--json",
        "--fleet",
        str(fleet),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--time-scale",
        "10",
        "--load",
        "0.2:0.4",
        "--duration",
        "40",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def banner(proc: asyncio.subprocess.Process) -> dict[str, str]:
    """The URLs the demo prints on stderr (with --json) before its first line."""
    urls: dict[str, str] = {}
    said: list[str] = []
    assert proc.stderr is not None
    while "telemetry" not in urls:
        line = (await asyncio.wait_for(proc.stderr.readline(), _WAIT_S)).decode()
        assert line, f"the demo ended before printing where it listens: {said}"
        said.append(line)
        key, _, rest = line.partition(": ")
        if key in ("front door", "admin API", "telemetry"):
            urls[key] = rest.split()[0] if key != "telemetry" else rest.split()[2].rstrip(",")
    return urls


async def next_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), _WAIT_S)
    assert raw, "the demo's output ended early"
    line: dict[str, Any] = json.loads(raw)
    return line


async def ctl(admin: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "console.cli",
        "ctl",
        "--admin",
        admin,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), _WAIT_S)
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
    the router, a ctl strategy switch shows in the next line, and Ctrl+C stops it all: exit
    0, nothing lost, the broker child reaped, every port free again."""
    replica_ports = (free_port(), free_port())
    async with demo_process(two_node_fleet(tmp_path, replica_ports)) as proc:
        urls = await banner(proc)
        broker_children = children(proc.pid)
        assert broker_children, "the embedded broker runs in a child process"

        line = await next_line(proc)
        assert line["strategy"] == "round-robin"  # whatever the fleet file says
        while not (telemetry_arrived(line) and line["client"].get("completed", 0) > 0):
            line = await next_line(proc)
        assert line["telemetry"]["broker"] == "connected"
        assert set(line["replicas"]) == {"a100-0", "v100-0"}

        code, said = await ctl(urls["admin API"], "strategy", "weighted-least-connections")
        assert code == 0, said
        assert (await next_line(proc))["strategy"] == "weighted-least-connections"

        proc.send_signal(signal.SIGINT)
        summary = (await next_line(proc))["summary"]
        assert await asyncio.wait_for(proc.wait(), _WAIT_S) == 0

    assert summary["outcomes"]["completed"] > 0
    assert "stopped" in summary["outcomes"]  # what the stop cut off is not counted failed
    assert summary["client"]["completed"] > 0
    assert summary["lost"] == 0
    assert [s["strategy"] for s in summary["strategy_switches"]] == ["weighted-least-connections"]
    assert not [pid for pid in broker_children if alive(pid)]
    front, admin = (int(urls[k].rsplit(":", 1)[1]) for k in ("front door", "admin API"))
    broker = int(urls["telemetry"].rsplit(":", 1)[1])
    for port in (*replica_ports, front, admin, broker):
        assert port_free(port), f"port {port} is still taken"
