"""Rollouts and traffic splits on ``gpurouter serve --workers 2``, as processes over loopback in
front of the emulator, with the control link (the supervisor's embedded broker) and without
(``--no-telemetry``): worker 0 runs them and every worker applies their drains and splits.

- A rolling update under a bounded load loses no request, ends with every replica on the new
  version in both workers, and neither worker sends anything to a replica being updated: each
  applied its drain before the update began and had no attempt fail on it.
- A canary's share is the same in both workers (0% then 100%, where the count is exact), and
  ``gpurouter ctl`` steers it through the service's admin API.
- A worker killed while a canary's replica is being moved comes back holding that drain and
  the split before it serves its first request.
- Bad input is refused as on one router: a floor that cannot be kept, an update command that
  fails, a version the replica never serves.

Which worker takes a connection is the kernel's choice; the tests make it theirs by stopping
(SIGSTOP) the other worker while a client connects: the connection is then accepted by the
running one and kept alive, so every request on it is that worker's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.emulator import EmulatedFleet
from tests.http_support import MODEL, Spec, hint
from tests.rollout_support import GATED
from tests.test_ctl import Ctl, _no_ctl_environment, one_error_line
from tests.test_emulator_support import any_ports, fleet_config
from tests.test_http_serve import read_line

__all__ = ["_no_ctl_environment"]  # the autouse fixture, applied here too

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

NEW = "Llama-3.1-8B-v2"
SECRET = "serve-workers-rollout-secret-0123456789"
MODES = pytest.mark.parametrize("telemetry", [False, True], ids=["no-telemetry", "control-link"])
BODY = f'{{"version": "{{version}}", "load_s": 1, "aliases": ["{MODEL}"]}}'
"""The emulator's version switch: the new name, served beside the stable one."""
WAIT = 1500
"""Polls (of 0.02 s) any wait may take: 30 s, far more than any of them needs."""


def fleet_yaml(
    specs: tuple[Spec, ...],
    emulated: EmulatedFleet,
    control_port: int,
    versions: dict[str, str],
    gate: Path | None,
) -> str:
    gpus = "\n".join(
        f"      - {{index: {i}, model: {s.gpu}, memory_gib: {80 if 'A100' in s.gpu else 32}}}"
        for i, s in enumerate(specs)
    )
    replicas = "\n".join(
        f'      - {{id: {rid}, endpoint: "{emulated.url(rid)}", gpus: [{i}], batch_size: 8'
        + (f", version: {versions[rid]}" if rid in versions else "")
        + "}"
        for i, rid in enumerate(emulated.replicas)
    )
    url = f"http://127.0.0.1:{control_port}/versions/{{replica}}"
    if gate is None:
        updater = f"{{http: {{url: '{url}', body: '{BODY}', expect_status: 202}}}}"
    else:
        script = gate.with_name("gated_update.py")
        script.write_text(GATED)
        run = f"{sys.executable} {script} {gate} {url} {{version}} {MODEL}"
        updater = f"{{command: {{run: '{run}', timeout_s: 60}}}}"
    return f"""cluster: serve-workers-rollout-test
model: {MODEL}
nodes:
  - name: node-0
    gpus:
{gpus}
    replicas:
{replicas}
router:
  strategy: {{name: least-connections}}
  health: {{check_interval_s: 0, engine_metrics_interval_s: 0}}
server: {{shutdown_grace_s: 10}}
rollout:
  floor: 0.3
  check_interval_s: 0.02
  drain_timeout_s: 30
  ready_timeout_s: 30
  updater: {updater}
"""


@dataclass
class Service:
    proc: asyncio.subprocess.Process
    front: str
    admin: str
    client: httpx.AsyncClient
    emulated: EmulatedFleet
    control_port: int

    async def get(self, path: str) -> Any:
        answer = await self.client.get(self.admin + path)
        assert answer.status_code == 200, answer.text
        return answer.json()

    async def post(self, path: str, **body: Any) -> httpx.Response:
        return await self.client.post(self.admin + path, json=body, headers={"X-Actor": "dana"})

    async def state(self, worker: int) -> dict[str, Any]:
        data: dict[str, Any] = await self.get(f"/admin/state?worker={worker}")
        return data

    async def pids(self) -> list[int]:
        return [w["pid"] for w in (await self.get("/admin/state"))["workers"]]

    async def events(self, worker: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = (await self.get(f"/admin/events?worker={worker}"))["events"]
        return events


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path,
    specs: tuple[Spec, ...],
    *,
    telemetry: bool,
    versions: dict[str, str] | None = None,
    gate: Path | None = None,
) -> AsyncIterator[Service]:
    """``serve --workers 2`` in front of emulated ``specs``; the fleet file's updater is the
    emulator's version switch (behind ``gate`` when given)."""
    config = fleet_config(*specs)
    node = config.nodes[0]
    declared = tuple(
        dataclasses.replace(r, version=(versions or {}).get(r.id)) for r in node.replicas
    )
    config = dataclasses.replace(config, nodes=(dataclasses.replace(node, replicas=declared),))
    async with EmulatedFleet(config, time_scale=5, ports=any_ports(specs)) as emulated:
        port = await emulated.start_control()
        fleet = tmp_path / "fleet.yaml"
        extra = "control: {secret_env: SERVE_WORKERS_SECRET}\n" if telemetry else ""
        fleet.write_text(fleet_yaml(specs, emulated, port, versions or {}, gate) + extra)
        with (tmp_path / "serve.err").open("wb") as errors:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "console.cli", "serve", "--config", str(fleet),
                "--workers", "2", *([] if telemetry else ["--no-telemetry"]),
                "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                stdout=subprocess.PIPE, stderr=errors,
                env={**os.environ, "PYTHONPATH": os.getcwd(), "SERVE_WORKERS_SECRET": SECRET},
            )  # fmt: skip
        workers: list[int] = []
        try:
            assert proc.stdout is not None
            front = await read_line(proc.stdout, "front door on")
            admin = await read_line(proc.stdout, "admin API on")
            async with httpx.AsyncClient(timeout=60) as client:
                service = Service(proc, front, admin, client, emulated, port)
                workers = await service.pids()
                if telemetry:
                    await _until_linked(service)
                yield service
        finally:
            for pid in workers:  # a worker a test stopped must be able to stop
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 40)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _until_linked(service: Service) -> None:
    """Until each worker has heard both workers' stats (a published command then waits for
    both workers' acknowledgements)."""
    for _ in range(WAIT):
        routers = [(await service.state(w))["telemetry"]["control"]["routers"] for w in (0, 1)]
        if all(len(r) >= 2 for r in routers):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the workers never heard each other over the broker")


@contextlib.asynccontextmanager
async def pinned(service: Service, worker: int, n: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``n`` clients whose one kept-alive connection worker ``worker`` accepted (the other
    worker stopped while they connected)."""
    pids = await service.pids()
    others = [pid for i, pid in enumerate(pids) if i != worker]
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    clients = [
        httpx.AsyncClient(base_url=service.front, timeout=60, limits=limits) for _ in range(n)
    ]
    try:
        for pid in others:
            os.kill(pid, signal.SIGSTOP)
        try:
            for c in clients:
                assert (await c.get("/v1/models")).status_code == 200
        finally:
            for pid in others:
                os.kill(pid, signal.SIGCONT)
        yield clients
    finally:
        for c in clients:
            await c.aclose()


async def complete(client: httpx.AsyncClient, stream: bool = False) -> str | None:
    """One request for the model; None when it completed, else what went wrong."""
    body = {"model": MODEL, "prompt": "p", "max_tokens": 8, "stream": stream, **hint(20, 8)}
    try:
        if not stream:
            answer = await client.post("/v1/completions", json=body)
            return None if answer.status_code == 200 else f"{answer.status_code} {answer.text}"
        async with client.stream("POST", "/v1/completions", json=body) as answer:
            text = "".join([line async for line in answer.aiter_lines()])
        if answer.status_code != 200 or "[DONE]" not in text or '"error"' in text:
            return f"stream {answer.status_code}: {text[-200:]}"
        return None
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"


@dataclass
class Load:
    ok: int = 0
    failed: list[str] = field(default_factory=list)


async def _loop(client: httpx.AsyncClient, load: Load, stop: asyncio.Event, bound: int) -> None:
    i = 0
    while not stop.is_set() and i < bound:
        i += 1
        problem = await complete(client, stream=i % 3 == 0)
        if problem is None:
            load.ok += 1
        else:
            load.failed.append(problem)


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


def _completed(state: dict[str, Any]) -> dict[str, int]:
    return {r["id"]: r["completed"] for r in state["replicas"]}


@MODES
async def test_a_rolling_update_under_workers_loses_nothing_and_both_workers_hold_its_drains(
    tmp_path: Path, telemetry: bool, ctl: Ctl
) -> None:
    specs = (Spec("a0"), Spec("v0", gpu="V100-32GB"), Spec("v1", gpu="V100-32GB"))
    async with (
        serving(tmp_path, specs, telemetry=telemetry) as service,
        pinned(service, 0, 2) as zero,
        pinned(service, 1, 2) as one,
    ):
        load, stop = Load(), asyncio.Event()
        tasks = [asyncio.create_task(_loop(c, load, stop, 300)) for c in zero + one]
        try:
            admin = ["--admin", service.admin]
            started = await ctl("rollout", "start", NEW, "--json", *admin)
            assert started.code == 0, started.err
            assert json.loads(started.out)["phase"] == "running"
            rollout = await _until_ended(ctl, admin)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        assert rollout["phase"] == "done", rollout["error"]
        assert load.failed == []
        assert load.ok > 0
        ids = [s.id for s in specs]
        assert {rid: v["version"] for rid, v in service.emulated.versions().items()} == (
            dict.fromkeys(ids, NEW)
        )
        leader = await service.events(0)
        updates = {
            e["args"]["replica"]: e["at"]
            for e in leader
            if e["kind"] == "rollout" and e["args"]["step"] == "update"
        }
        assert sorted(updates) == sorted(ids)
        for worker in (0, 1):
            state = await service.state(worker)
            assert sum(state["outcomes"].values()) > 0  # this worker carried some of the load
            for r in state["replicas"]:
                assert (r["state"], r["version"]) == ("active", NEW)
                # Nothing this worker sent was cut by an update or refused by a loading one.
                assert (r["failed"], r["retries"]) == (0, 0), r
            drains = {
                e["args"]["replica"]: e["at"]
                for e in await service.events(worker)
                if e["kind"] == "drain" and e["ok"]
            }
            # Each worker held each replica out before worker 0 began to update it.
            assert sorted(drains) == sorted(ids)
            assert all(drains[rid] <= updates[rid] for rid in ids), (worker, drains, updates)


@MODES
async def test_a_canary_split_is_the_same_in_both_workers_and_ctl_steers_it(
    tmp_path: Path, telemetry: bool, ctl: Ctl
) -> None:
    specs = (Spec("b0"), Spec("g0"))
    async with (
        serving(tmp_path, specs, telemetry=telemetry, versions={"g0": NEW}) as service,
        pinned(service, 0, 1) as zero,
        pinned(service, 1, 1) as one,
    ):
        admin = ["--admin", service.admin, "--json"]
        started = await ctl(
            "rollout", "canary", "start", NEW, "--replicas", "g0", "--manual", *admin
        )
        assert started.code == 0, started.err
        assert json.loads(started.out)["share"] == 0.0
        for share, expected in ((0, {"b0": 6, "g0": 0}), (100, {"b0": 0, "g0": 6})):
            if share:
                step = await ctl("rollout", "canary", "step", str(share), *admin)
                assert step.code == 0, step.err
            for worker, clients in ((0, zero), (1, one)):
                split = (await service.state(worker))["split"]
                assert split == {"model": MODEL, "old": MODEL, "new": NEW, "share": share / 100}
                before = _completed(await service.state(worker))
                assert [await complete(clients[0]) for _ in range(6)] == [None] * 6
                after = _completed(await service.state(worker))
                assert {r: after[r] - before[r] for r in after} == expected, (worker, share)
        status = await ctl("rollout", "canary", "status", *admin)
        assert json.loads(status.out)["share"] == 1.0
        # The split's state is worker 0's, whichever way it is asked.
        assert (await service.get("/admin/split"))["split"]["id"] == json.loads(status.out)["id"]
        aborted = await ctl("rollout", "canary", "abort", *admin)
        assert aborted.code == 0, aborted.err
        for _ in range(WAIT):
            splits = [(await service.state(w))["split"] for w in (0, 1)]
            if splits == [None, None]:
                break
            await asyncio.sleep(0.02)
        assert splits == [None, None]


@MODES
async def test_a_worker_killed_while_a_canary_replica_moves_comes_back_holding_drain_and_split(
    tmp_path: Path, telemetry: bool
) -> None:
    gate = tmp_path / "gate"
    specs = (Spec("b0"), Spec("g0"))
    async with serving(tmp_path, specs, telemetry=telemetry, gate=gate) as service:
        answer = await service.post(
            "/admin/split", action="canary", version=NEW, replicas=["g0"], manual=True
        )
        assert answer.status_code == 200, answer.text
        for _ in range(WAIT):  # held in its update until the gate opens
            rollout = (await service.get("/admin/rollout"))["rollout"]
            if rollout is not None and rollout["steps"]["g0"] == "updating":
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the canary's replica was never being updated")
        w1 = (await service.pids())[1]
        os.kill(w1, signal.SIGKILL)
        for _ in range(WAIT):
            workers = (await service.get("/admin/state"))["workers"]
            if workers[1]["pid"] not in (None, w1) and workers[1]["answered"]:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("worker 1 was not restarted")
        state = await service.state(1)
        assert state["worker"]["pid"] != w1
        assert {r["id"]: r["state"] for r in state["replicas"]}["g0"] in ("draining", "drained")
        assert state["split"] == {"model": MODEL, "old": MODEL, "new": NEW, "share": 0.0}
        restored = [
            e["kind"] for e in await service.events(1) if e["actor"].startswith("restored:")
        ]
        assert set(restored) >= {"drain", "split"}
        async with pinned(service, 1, 1) as one:  # the restarted worker routes around g0
            before = _completed(await service.state(1))
            assert [await complete(one[0]) for _ in range(4)] == [None] * 4
            after = _completed(await service.state(1))
            assert {r: after[r] - before[r] for r in after} == {"b0": 4, "g0": 0}
        gate.touch()
        for _ in range(WAIT):
            split = (await service.get("/admin/split"))["split"]
            if split["phase"] == "running":
                break
            await asyncio.sleep(0.02)
        assert split["phase"] == "running", split
        stepped = await service.post("/admin/split", action="step", percent=100)
        assert stepped.status_code == 200, stepped.text
        for worker in (0, 1):
            state = await service.state(worker)
            assert state["split"]["share"] == 1.0
            assert {r["id"]: r["state"] for r in state["replicas"]}["g0"] == "active"


async def test_bad_input_is_refused_under_workers_as_on_one_router(
    tmp_path: Path, ctl: Ctl
) -> None:
    specs = (Spec("a0"), Spec("a1"))
    async with serving(tmp_path, specs, telemetry=False) as service:
        admin = ["--admin", service.admin]
        unreadable = await service.post("/admin/rollout", action="start", version="not a name")
        assert unreadable.status_code == 400
        assert "must be a model name" in unreadable.json()["error"]["message"]
        unknown = await service.post("/admin/split", action="canary", version="v9")
        assert unknown.status_code == 409
        assert "no replica runs v9" in unknown.json()["error"]["message"]
        floor = await ctl("rollout", "start", NEW, "--floor", "0.99", *admin)
        assert floor.code == 1
        assert "under the floor of 99%" in one_error_line(floor)
        never = (
            f"--http-url=http://127.0.0.1:{service.control_port}/versions/{{replica}}",
            f'--http-body={{"version": "other-model", "load_s": 0, "aliases": ["{MODEL}"]}}',
            "--http-expect=202",
            "--ready-timeout=0.3",
        )
        for settings, words in (
            (("--command", "false"), "the update failed: exit 1"),
            (never, f"does not serve {NEW} after 0.3 s"),
        ):
            started = await ctl("rollout", "start", NEW, "--floor", "0.3", *settings, *admin)
            assert started.code == 0, started.err
            rollout = await _until_ended(ctl, admin)
            assert rollout["phase"] == "failed"
            assert words in rollout["error"]
            for worker in (0, 1):  # the fleet is left serving, in both workers
                state = await service.state(worker)
                assert {r["state"] for r in state["replicas"]} == {"active"}


async def _until_ended(ctl: Ctl, admin: list[str]) -> dict[str, Any]:
    for _ in range(WAIT):
        result = await ctl("rollout", "status", "--json", *admin)
        rollout: dict[str, Any] = json.loads(result.out)
        if rollout["phase"] not in ("running", "paused", "rolling back"):
            return rollout
        await asyncio.sleep(0.02)
    raise AssertionError("the rollout did not end")
