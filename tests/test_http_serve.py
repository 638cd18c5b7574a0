"""``gpurouter serve`` as a process: SIGTERM under load lets in-flight requests finish and
exits 0; a bad fleet file exits 2."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from router.emulator import EmulatedFleet
from tests.http_support import MODEL, Spec, hint
from tests.test_emulator_support import any_ports, fleet_config

SPECS = (Spec("a"), Spec("b"))


def fleet_yaml(emulated: EmulatedFleet) -> str:
    replicas = "\n".join(
        f'      - {{id: {rid}, endpoint: "{emulated.url(rid)}", gpus: [{i}]}}'
        for i, rid in enumerate(emulated.replicas)
    )
    return f"""cluster: serve-test
model: {MODEL}
nodes:
  - name: node-0
    gpus:
      - {{index: 0, model: A100-80GB, memory_gib: 80}}
      - {{index: 1, model: A100-80GB, memory_gib: 80}}
    replicas:
{replicas}
router:
  health: {{check_interval_s: 0}}
server: {{shutdown_grace_s: 20}}
"""


async def read_line(stream: asyncio.StreamReader, prefix: str) -> str:
    while True:
        line = (await asyncio.wait_for(stream.readline(), 20)).decode()
        assert line, "the router exited before it listened"
        if line.startswith(prefix):
            return line.rsplit(" ", 1)[1].strip()


async def all_admitted(client: httpx.AsyncClient, admin: str, n: int) -> None:
    """Wait (bounded) until the router holds ``n`` requests, running or queued."""
    for _ in range(500):
        state = (await client.get(admin + "/admin/state")).json()
        if state["in_flight"] + state["queue"]["depth"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the load never reached the router")


async def test_sigterm_under_load_finishes_in_flight_requests_and_exits_0(tmp_path: Path) -> None:
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(fleet_yaml(emulated))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "serve", "--workers", "1", "--config", str(fleet),
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            front = await read_line(proc.stdout, "front door on")
            admin = await read_line(proc.stdout, "admin API on")
            async with httpx.AsyncClient(timeout=20) as client:
                body = {"model": MODEL, "prompt": "p", "max_tokens": 150, **hint(20, 150)}
                url = front + "/v1/completions"
                requests = [asyncio.create_task(client.post(url, json=body)) for _ in range(8)]
                stream_body = {**body, "stream": True}
                async with client.stream("POST", url, json=stream_body) as stream:
                    lines = stream.aiter_lines()
                    while not (await anext(lines)).startswith("data: {"):
                        pass
                    await all_admitted(client, admin, 9)
                    proc.send_signal(signal.SIGTERM)
                    rest = [line async for line in lines]
                answers = await asyncio.gather(*requests)
            assert rest[-2] == "data: [DONE]"
            assert [r.status_code for r in answers] == [200] * 8
            assert all(r.json()["usage"]["completion_tokens"] == 150 for r in answers)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        stdout = (await proc.stdout.read()).decode() if proc.stdout else ""
        assert "stopped" in stdout


def test_a_bad_fleet_file_exits_2(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: []\nbogus: 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "console.cli", "serve", "--config", str(fleet)],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert done.returncode == 2
    assert "gpurouter serve:" in done.stderr
    assert "Traceback" not in done.stderr


async def test_with_1024_files_a_client_is_served_past_1000_idle_sockets(tmp_path: Path) -> None:
    """Sockets that never send took every descriptor a 1,024-file router had: a new client
    was never accepted. Now a new connection replaces the longest-idle one, and the idle
    ones are closed after ``server.header_timeout_s``."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this test opens 1,000 sockets; the open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(
            fleet_yaml(emulated).replace("shutdown_grace_s: 20", "header_timeout_s: 3")
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "serve", "--workers", "1", "--config", str(fleet),
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
        )  # fmt: skip
        idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            assert proc.stdout is not None
            front = await read_line(proc.stdout, "front door on")
            host, port = front.removeprefix("http://").split(":")
            idle = [await asyncio.open_connection(host, int(port)) for _ in range(1000)]
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, pool=10)) as client:
                body = {"model": MODEL, "prompt": "p", "max_tokens": 2, **hint(5, 2)}
                answer = await client.post(front + "/v1/completions", json=body)
            assert answer.status_code == 200
            ends = await asyncio.gather(*(asyncio.wait_for(r.read(-1), 20) for r, _ in idle))
            assert ends == [b""] * 1000  # each closed without a word: it never asked anything
        finally:
            for _, writer in idle:
                writer.close()
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)


def test_a_token_variable_that_is_not_set_exits_2_and_says_which(tmp_path: Path) -> None:
    """Whatever the admin address: loopback, or not (where no token is its own error)."""
    for admin in ("127.0.0.1:0", "0.0.0.0:0"):
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(
            f"""model: {MODEL}
nodes:
  - name: node-0
    gpus: [{{index: 0, model: A100-80GB, memory_gib: 80}}]
    replicas: [{{id: a, endpoint: "http://127.0.0.1:9", gpus: [0]}}]
server: {{listen: "127.0.0.1:0", admin_listen: "{admin}", admin_token_env: GPUROUTER_UNSET_TOKEN}}
"""
        )
        env = {k: v for k, v in os.environ.items() if k != "GPUROUTER_UNSET_TOKEN"}
        done = subprocess.run(
            [sys.executable, "-m", "console.cli", "serve", "--config", str(fleet)],
            capture_output=True, text=True, timeout=30, env={**env, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr == (
            f"gpurouter serve: {fleet}: server.admin_token_env: names the environment variable "
            "GPUROUTER_UNSET_TOKEN, which is not set (or is empty); set it to the admin API's "
            "token, or remove server.admin_token_env\n"
        )
