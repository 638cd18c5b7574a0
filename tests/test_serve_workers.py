"""``gpurouter serve --workers 2`` as processes over loopback against the emulator: each
worker's least-connections counts both workers' requests; a worker killed under load loses no
request it had not taken, and comes back; one it had taken and not yet answered, the OpenAI
client sends again; SIGTERM drains every worker and exits 0.

Which worker takes a connection is the kernel's choice; the tests make it theirs by stopping
(SIGSTOP) the workers that must not take it: a stopped process accepts nothing, and the
connection waits in the one accept queue all workers share until a running one does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openai import AsyncOpenAI

from router.emulator import EmulatedFleet
from tests.http_support import MODEL, Spec, hint
from tests.test_emulator_support import any_ports, fleet_config
from tests.test_http_serve import read_line

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SPECS = (Spec("a"), Spec("b"))
SECRET = "serve-workers-secret-0123456789"
LONG = {"model": MODEL, "prompt": "p", "max_tokens": 4000, "stream": True, **hint(20, 4000)}
"""A stream that lasts far longer than a test: held open, then closed by the client."""


def fleet_yaml(emulated: EmulatedFleet) -> str:
    replicas = "\n".join(
        f'      - {{id: {rid}, endpoint: "{emulated.url(rid)}", gpus: [{i}], batch_size: 16}}'
        for i, rid in enumerate(emulated.replicas)
    )
    return f"""cluster: serve-workers-test
model: {MODEL}
nodes:
  - name: node-0
    gpus:
      - {{index: 0, model: A100-80GB, memory_gib: 80}}
      - {{index: 1, model: A100-80GB, memory_gib: 80}}
    replicas:
{replicas}
router:
  strategy: {{name: least-connections}}
  health: {{check_interval_s: 0}}
server: {{shutdown_grace_s: 20}}
"""


@dataclass
class Service:
    proc: asyncio.subprocess.Process
    front: str
    admin: str
    client: httpx.AsyncClient

    async def state(self, worker: int | None = None) -> dict[str, Any]:
        query = "" if worker is None else f"?worker={worker}"
        answer = await self.client.get(f"{self.admin}/admin/state{query}")
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    async def pids(self) -> list[int]:
        return [w["pid"] for w in (await self.state())["workers"]]


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, time_scale: float = 5, *, telemetry: bool = False
) -> AsyncIterator[Service]:
    """``serve --workers 2``; ``telemetry``: with the embedded broker and a signed control
    link, else ``--no-telemetry``."""
    config = fleet_config(*SPECS)
    async with EmulatedFleet(config, time_scale=time_scale, ports=any_ports(SPECS)) as emulated:
        fleet = tmp_path / "fleet.yaml"
        extra = "control: {secret_env: SERVE_WORKERS_SECRET}\n" if telemetry else ""
        fleet.write_text(fleet_yaml(emulated) + extra)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "serve", "--config", str(fleet),
            "--workers", "2", *([] if telemetry else ["--no-telemetry"]),
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd(), "SERVE_WORKERS_SECRET": SECRET},
        )  # fmt: skip
        workers: list[int] = []
        try:
            assert proc.stdout is not None
            front = await read_line(proc.stdout, "front door on")
            admin = await read_line(proc.stdout, "admin API on")
            async with httpx.AsyncClient(timeout=30) as client:
                service = Service(proc, front, admin, client)
                workers = await service.pids()
                yield service
        finally:
            for pid in workers:  # a worker a test stopped must be able to drain
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 40)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


@dataclass
class Stream:
    """A stream held open on a connection of its own."""

    client: httpx.AsyncClient
    response: httpx.Response
    lines: AsyncIterator[str]
    """Kept: a line iterator collected as garbage closes its response."""

    async def close(self) -> None:
        await self.response.aclose()
        await self.client.aclose()


async def open_stream(front: str) -> Stream:
    """A stream on a connection of its own, once its first token came (it is placed)."""
    client = httpx.AsyncClient(timeout=30)
    request = client.build_request("POST", front + "/v1/completions", json=LONG)
    response = await client.send(request, stream=True)
    lines = response.aiter_lines()
    while not (await anext(lines)).startswith("data: {"):
        pass
    return Stream(client, response, lines)


async def own(service: Service, worker: int) -> dict[str, int]:
    return dict((await service.state(worker))["worker"]["own_in_flight"])


async def test_least_connections_in_each_worker_sees_the_sum_of_both_workers_requests(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, time_scale=1) as service:
        w0, w1 = await service.pids()
        streams: list[Stream] = []
        try:
            os.kill(w1, signal.SIGSTOP)  # these three go to worker 0
            streams += [await open_stream(service.front) for _ in range(3)]
            os.kill(w1, signal.SIGCONT)
            os.kill(w0, signal.SIGSTOP)  # and this one to worker 1
            streams.append(await open_stream(service.front))
            os.kill(w0, signal.SIGCONT)
            mine = [await own(service, 0), await own(service, 1)]
            assert sum(mine[0].values()) == 3
            assert sum(mine[1].values()) == 1
            total = {r: mine[0][r] + mine[1][r] for r in mine[0]}
            # Worker 1 put its one request on the replica worker 0 had left with fewer.
            assert sorted(total.values()) == [2, 2]
            for worker in (0, 1):
                seen = {r["id"]: r["in_flight"] for r in (await service.state(worker))["replicas"]}
                assert seen == total
        finally:
            for stream in streams:
                await stream.close()


async def _raw_request(
    front: str, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request whose bytes are in the kernel once this returns (connected and written)."""
    host, port = front.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


async def _status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    try:
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]) if answer else 0


async def test_a_killed_worker_loses_no_request_it_had_not_taken_and_is_restarted(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        w0, w1 = await service.pids()
        body = orjson.dumps({"model": MODEL, "prompt": "p", "max_tokens": 20, **hint(20, 20)})
        held: list[Stream] = []
        try:
            os.kill(w0, signal.SIGSTOP)
            held.append(await open_stream(service.front))  # under way on worker 1
            os.kill(w1, signal.SIGSTOP)
            # Neither worker accepts: these wait in the shared accept queue.
            waiting = [await _raw_request(service.front, body) for _ in range(8)]
            os.kill(w1, signal.SIGKILL)
            os.kill(w0, signal.SIGCONT)
            statuses = await asyncio.gather(*(_status(r, w) for r, w in waiting))
            assert statuses == [200] * 8
            # The stream worker 1 was relaying died with it: that is what is lost.
            with pytest.raises(httpx.HTTPError):
                async for _ in held[0].lines:
                    pass
        finally:
            for stream in held:
                await stream.close()
        for _ in range(600):  # bounded: the restart waits 0.1 s, the new worker starts
            state = await service.state()
            worker = state["workers"][1]
            if worker["pid"] not in (None, w1) and worker["answered"]:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("worker 1 was not restarted")
        assert worker["restarts"] == 1
        assert [r["in_flight"] for r in state["replicas"]] == [0, 0]  # its row was zeroed
        metrics = (await service.client.get(service.front + "/metrics")).text
        assert 'gpurouter_worker_restarts_total{worker="1"} 1.0' in metrics


async def test_a_request_a_killed_worker_held_before_its_first_byte_is_retried_by_the_client(
    tmp_path: Path,
) -> None:
    """A request the killed worker had taken but not answered (no byte sent) ends with the
    connection: the real OpenAI client, with its default retries, sends it again and gets its
    answer from the other worker, so the caller loses nothing. (A stream already under way
    has sent bytes and cannot be replayed: the test above.)"""
    async with serving(tmp_path) as service:
        w0, w1 = await service.pids()
        client = AsyncOpenAI(base_url=service.front + "/v1", api_key="test", timeout=60)
        try:
            os.kill(w0, signal.SIGSTOP)  # worker 1 takes it
            answer = asyncio.ensure_future(
                client.completions.create(
                    model=MODEL, prompt="p", max_tokens=300, extra_body=hint(20, 300)
                )
            )
            for _ in range(400):  # bounded: until worker 1 has it on a replica
                if sum((await own(service, 1)).values()) == 1:
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError("worker 1 never took the request")
            assert not answer.done()  # not answered yet: no byte sent
            os.kill(w0, signal.SIGCONT)
            os.kill(w1, signal.SIGKILL)
            completion = await asyncio.wait_for(answer, 60)
            assert completion.choices[0].finish_reason == "length"
            assert completion.usage is not None
            assert completion.usage.completion_tokens == 300
        finally:
            await client.close()


async def test_sigterm_lets_every_workers_requests_finish_and_exits_0(tmp_path: Path) -> None:
    async with serving(tmp_path) as service:
        w0, w1 = await service.pids()
        body = {"model": MODEL, "prompt": "p", "max_tokens": 150, **hint(20, 150)}
        url = service.front + "/v1/completions"
        clients = [httpx.AsyncClient(timeout=40) for _ in range(4)]
        try:
            os.kill(w1, signal.SIGSTOP)
            first = [asyncio.create_task(c.post(url, json=body)) for c in clients[:2]]
            await _until_held(service, 0, 2)
            os.kill(w1, signal.SIGCONT)
            os.kill(w0, signal.SIGSTOP)
            second = [asyncio.create_task(c.post(url, json=body)) for c in clients[2:]]
            await _until_held(service, 1, 2)
            os.kill(w0, signal.SIGCONT)
            service.proc.send_signal(signal.SIGTERM)
            answers = await asyncio.gather(*first, *second)
        finally:
            for c in clients:
                await c.aclose()
        assert [r.status_code for r in answers] == [200] * 4
        assert all(r.json()["usage"]["completion_tokens"] == 150 for r in answers)
        assert await asyncio.wait_for(service.proc.wait(), 40) == 0
        assert service.proc.stdout is not None
        assert "stopped" in (await service.proc.stdout.read()).decode()


async def _until_held(service: Service, worker: int, n: int) -> None:
    """Until worker ``worker`` holds ``n`` requests, running or queued (bounded)."""
    for _ in range(500):
        state = await service.state(worker)
        if state["in_flight"] + state["queue"]["depth"] >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"worker {worker} never held {n} requests")


def test_workers_must_be_a_whole_number_at_least_1() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "console.cli", "serve", "--config", "x.yaml", "--workers", "0"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert done.returncode == 2
    assert "--workers" in done.stderr


async def test_with_a_control_link_a_command_reaches_every_worker_through_the_broker(
    tmp_path: Path,
) -> None:
    """One worker publishes the command as desired state; both apply it, and say so."""
    async with serving(tmp_path, telemetry=True) as service:
        for _ in range(500):  # bounded: each worker hears the other's stats within a second
            routers = (await service.state(0))["telemetry"]["control"]["routers"]
            if len(routers) >= 2:
                break
            await asyncio.sleep(0.02)
        answer = await service.client.post(
            service.admin + "/admin/commands",
            json={"command": "weight", "replica": "b", "weight": 4.0},
            headers={"X-Actor": "alice"},
        )
        assert answer.status_code == 200, answer.text
        applied_by = answer.json()["applied_by"]
        assert sorted(name.rsplit("-", 1)[1] for name in applied_by) == ["w0", "w1"]
        assert all(applied_by.values())
        for worker in (0, 1):
            state = await service.state(worker)
            assert next(r["weight"] for r in state["replicas"] if r["id"] == "b") == 4.0


async def test_without_a_control_link_a_command_goes_to_every_worker_and_events_stream(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as service:
        answer = await service.client.post(
            service.admin + "/admin/commands",
            json={"command": "weight", "replica": "a", "weight": 3.0},
            headers={"X-Actor": "alice"},
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["workers"] == {"0": 200, "1": 200}
        for worker in (0, 1):
            state = await service.state(worker)
            assert next(r["weight"] for r in state["replicas"] if r["id"] == "a") == 3.0
        url = service.admin + "/admin/events?follow=1&format=jsonl"
        async with service.client.stream("GET", url) as stream:
            first = orjson.loads(await anext(stream.aiter_lines()))
        assert (first["kind"], first["actor"]) == ("weight", "alice")
        # Worker 0 runs the service's rollouts: none yet.
        rollout = await service.client.get(service.admin + "/admin/rollout")
        assert rollout.status_code == 200, rollout.text
        assert rollout.json() == {"rollout": None}
