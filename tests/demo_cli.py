"""``gpurouter demo --headless --json`` as a child process, as a user runs it, for the demo's
end-to-end tests: start it, read its banner and its lines, find its lab and router
processes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.demo_helpers import children

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 60.0
"""Guard against a hang only (the run takes a few seconds)."""


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
    """The URLs the demo prints on stderr (with --json) before its first line, and the admin
    API's token (``token``)."""
    urls: dict[str, str] = {}
    said: list[str] = []
    assert proc.stderr is not None
    while "telemetry" not in urls:
        line = (await asyncio.wait_for(proc.stderr.readline(), WAIT_S)).decode()
        assert line, f"the demo ended before printing where it listens: {said}"
        said.append(line)
        key, _, rest = line.partition(": ")
        if key in ("front door", "admin API", "telemetry"):
            urls[key] = rest.split()[0] if key != "telemetry" else rest.split()[2].rstrip(",")
        if key == "admin API" and rest.split()[1] == "token":
            urls["token"] = rest.split()[2]
    return urls


async def next_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
    assert raw, "the demo's output ended early"
    line: dict[str, Any] = json.loads(raw)
    return line


def lab_children(pid: int) -> list[int]:
    """The demo's lab processes among the children of ``pid``."""
    return children_running(pid, "router.demo.lab_child")


def router_children(pid: int) -> list[int]:
    """The demo's router processes among the children of ``pid``."""
    return children_running(pid, "router.demo.router_child")


def children_running(pid: int, module: str) -> list[int]:
    """The children of ``pid`` running ``python -m module``."""
    found = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if module.encode() in cmdline.split(b"\0"):
            found.append(child)
    return found
