"""``gpurouter emulate``: starts every replica, serves, and stops cleanly on a signal."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from console.cli import main
from tests.test_emulator_support import MODEL, completion

ROOT = Path(__file__).resolve().parent.parent


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _fleet_file(tmp_path: Path, host: str, ports: list[int]) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"model: {MODEL}\n"
        "nodes:\n"
        "  - name: n0\n"
        "    gpus:\n"
        "      - {index: 0, model: A100-80GB, memory_gib: 80}\n"
        "      - {index: 1, model: V100-32GB, memory_gib: 32}\n"
        "    replicas:\n"
        f"      - {{id: fast, endpoint: 'http://{host}:{ports[0]}', gpus: [0]}}\n"
        f"      - {{id: slow, endpoint: 'http://{host}:{ports[1]}', gpus: [1]}}\n"
    )
    return path


async def _interrupt_while_streaming(
    client: httpx.AsyncClient, url: str, proc: asyncio.subprocess.Process
) -> None:
    """Send SIGINT once the first line of a long stream came; wait (5 s at most) for the exit."""
    body = completion(100, 100_000, max_tokens=100_000, stream=True)
    async with client.stream("POST", url, json=body) as stream:
        async for _ in stream.aiter_lines():
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
                await asyncio.wait_for(proc.wait(), 5)


async def test_emulate_prints_each_replica_serves_and_exits_zero_on_sigint(
    tmp_path: Path,
) -> None:
    ports = _free_ports(2)
    config = _fleet_file(tmp_path, "127.0.0.1", ports)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "console.cli",
        "emulate",
        "--config",
        str(config),
        "--time-scale",
        "100",
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 15)).decode() for _ in range(2)]
        assert lines == [
            f"emulating fast (A100-80GB x1, {MODEL}) on http://127.0.0.1:{ports[0]}\n",
            f"emulating slow (V100-32GB x1, {MODEL}) on http://127.0.0.1:{ports[1]}\n",
        ]
        async with httpx.AsyncClient(timeout=5.0) as client:
            url = f"http://127.0.0.1:{ports[1]}/v1/completions"
            answer = await client.post(url, json=completion(100, 3, max_tokens=3))
            assert answer.json()["usage"]["completion_tokens"] == 3
            # A long stream is still open when the signal comes: shutdown does not wait for it.
            with pytest.raises(httpx.HTTPError):
                await _interrupt_while_streaming(client, url, proc)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_emulate_refuses_an_endpoint_off_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _fleet_file(tmp_path, "10.1.2.3", [8000, 8001])
    assert main(["emulate", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpurouter emulate: ")
    assert "http://10.1.2.3:8000 is not on this machine's loopback" in err


def test_emulate_takes_the_control_listener_on_loopback_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _fleet_file(tmp_path, "127.0.0.1", [8000, 8001])
    assert main(["emulate", "--config", str(config), "--control-listen", "0.0.0.0:9100"]) == 2
    assert "--control-listen must be a loopback HOST:PORT" in capsys.readouterr().err
