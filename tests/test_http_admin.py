"""The admin API: bearer auth, state, commands through the control surface, the audit trail
(streamed too), routing decisions; drain and preempt under load lose nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest

from router.control import Drain
from router.core import Outcome
from router.errors import ConfigError
from router.http.server import RouterServer
from router.replica import ReplicaState
from router.telemetry.status import DISABLED
from tests.http_support import Spec, routed, routed_fleet
from tests.test_emulator_support import fleet_config, metric, until
from tests.test_http_failover import FAST_RETRY, assert_counts_add_up, load

SPECS = (Spec("a"), Spec("b"), Spec("c"))
TOKEN = "s3cret-token"


async def test_with_a_token_set_no_token_is_401_and_a_wrong_one_403() -> None:
    async with routed(SPECS[:1], admin_token=TOKEN) as (server, _):
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            missing = await admin.get("/admin/state")
            wrong = await admin.get("/admin/state", headers={"Authorization": "Bearer nope"})
            right = await admin.get("/admin/state", headers={"Authorization": f"Bearer {TOKEN}"})
            command = await admin.post("/admin/commands", json={"command": "drain", "replica": "a"})
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert wrong.status_code == 403
        assert right.status_code == 200
        assert command.status_code == 401
        assert server.core.replica("a").state is ReplicaState.ACTIVE


def test_a_non_loopback_admin_address_without_a_token_is_refused() -> None:
    fleet = fleet_config(Spec("a"))
    with pytest.raises(ConfigError, match=r"server\.admin_listen"):
        RouterServer(fleet, listen="127.0.0.1:0", admin_listen="0.0.0.0:0")
    RouterServer(fleet, listen="127.0.0.1:0", admin_listen="0.0.0.0:0", admin_token=TOKEN)


async def test_state_commands_events_and_decisions() -> None:
    async with routed(SPECS[:2]) as (server, emu):
        server.admin.telemetry = lambda: DISABLED
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            applied = await admin.post(
                "/admin/commands",
                json={"command": "weight", "replica": "a", "weight": 3},
                headers={"X-Actor": "alice"},
            )
            refused = await admin.post(
                "/admin/commands", json={"command": "undrain", "replica": "a"}
            )
            unreadable = await admin.post("/admin/commands", json={"command": "fly"})
            not_json = await admin.post(
                "/admin/commands", content=b"{", headers={"Content-Type": "application/json"}
            )
            async with httpx.AsyncClient() as front:
                body = {"model": emu.config.model, "prompt": "hi", "max_tokens": 2}
                await front.post(server.front_url + "/v1/completions", json=body)
            state = (await admin.get("/admin/state")).json()
            events = (await admin.get("/admin/events", params={"since": 0})).json()["events"]
            decisions = (await admin.get("/admin/decisions", params={"limit": 5})).json()
            chose = decisions["decisions"][-1]["chosen"]
            mine = (await admin.get("/admin/decisions", params={"replica": chose})).json()
            none = (await admin.get("/admin/decisions", params={"replica": "nowhere"})).json()
        assert applied.status_code == 200
        assert applied.json()["ok"] is True
        assert applied.json()["actor"] == "alice"
        assert refused.status_code == 409
        assert refused.json()["ok"] is False
        assert unreadable.status_code == 400
        assert "unknown command" in unreadable.json()["error"]["message"]
        assert not_json.status_code == 400
        assert [r["id"] for r in state["replicas"]] == ["a", "b"]
        assert state["replicas"][0]["weight"] == 3
        assert state["outcomes"] == {"completed": 1}
        assert set(state["health"]) == {"a", "b"}
        assert state["telemetry"]["broker"] == "disabled"
        assert [(e["kind"], e["actor"], e["ok"]) for e in events] == [
            ("weight", "alice", True),
            ("undrain", "admin", False),
        ]
        (decision,) = decisions["decisions"]
        assert decision["chosen"] in {"a", "b"}
        assert {c["replica"] for c in decision["candidates"]} == {"a", "b"}
        assert mine["decisions"] == [decision]  # only those that chose that replica
        assert none["decisions"] == []


async def test_a_replica_is_measured_once_its_own_requests_have_run_the_model() -> None:
    """The live router runs the performance model on each replica's own requests off the
    event loop (after 50); requests completed once that run is back are measured by it, and
    the admin state carries the measured rate."""
    async with routed(SPECS[:1]) as (server, emu):
        core = server.core
        replica = core.replica("a")

        async def measured() -> bool:
            async with httpx.AsyncClient() as front:
                body = {"model": emu.config.model, "prompt": "hi", "max_tokens": 2}
                url = server.front_url + "/v1/completions"
                for _ in range(10):
                    assert (await front.post(url, json=body)).is_success
            core.refresh_capacity()
            return core.capacity.estimate(replica, core.clock()).measured_rate is not None

        rounds = 0
        while not await measured():
            rounds += 1
            assert rounds < 100, "never measured"  # bounded: a model run is well under 1 s
            await asyncio.sleep(0.05)
        assert rounds >= 4  # nothing is measured before 50 of its own completions
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            state = (await admin.get("/admin/state")).json()
    (row,) = state["replicas"]
    assert row["capacity_measured_rps"] > 0


async def test_state_carries_learned_capacity_and_kv_size_with_source_and_age() -> None:
    """Learned req/s with its source, age, prior and measurement; the KV cache's size with its
    source and the engine reading's age; the engine's preemption counter. /metrics carries
    the same figures by replica and source."""
    async with routed(SPECS[:2]) as (server, emu):
        await server.engine_metrics.poll_once()
        async with httpx.AsyncClient() as front:
            body = {"model": emu.config.model, "prompt": "hi", "max_tokens": 2}
            assert (await front.post(server.front_url + "/v1/completions", json=body)).is_success
            text = (await front.get(server.front_url + "/metrics")).text
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            state = (await admin.get("/admin/state")).json()
        kv = {r.id: r.engine.kv_capacity_tokens for r in server.core.pool if r.engine}
    by_id = {r["id"]: r for r in state["replicas"]}
    (served,) = [r for r in by_id.values() if r["completed"] == 1]
    (idle,) = [r for r in by_id.values() if r["completed"] == 0]
    for r in (served, idle):
        assert r["capacity_rps"] > 0
        assert r["capacity_rate"] > 0
        assert r["capacity_source"] == "prior"  # one completion is too few to lead
        assert r["capacity_prior_rps"] > 0
        assert r["kv_capacity_tokens"] == kv[r["id"]]
        assert r["kv_capacity_source"] == "engine"
        assert r["kv_capacity_age_s"] >= 0
        assert r["engine_preemptions"] == 0
        assert r["load"] >= 0
    assert served["capacity_age_s"] >= 0
    # Measured once 50 of its own requests have run the model on the lengths it served.
    assert served["capacity_measured_rps"] is None
    assert idle["capacity_age_s"] is None
    assert idle["capacity_measured_rps"] is None
    for r in (served, idle):
        labels = f'replica="{r["id"]}",source="prior"'
        assert metric(text, f"gpurouter_replica_capacity_rps{{{labels}}}") > 0
        labels = f'replica="{r["id"]}",source="engine"'
        assert metric(text, f"gpurouter_replica_kv_capacity_tokens{{{labels}}}") == kv[r["id"]]
    age = "gpurouter_replica_capacity_age_seconds"
    assert metric(text, f'{age}{{replica="{served["id"]}"}}') >= 0
    assert f'{age}{{replica="{idle["id"]}"}}' not in text  # never refined: no age


@pytest.mark.parametrize("fmt", ["sse", "jsonl"])
async def test_events_follow_streams_new_events_as_they_happen(fmt: str) -> None:
    async with routed(SPECS[:2]) as (server, _):
        params = {"follow": "1", "format": fmt}
        lines: list[str] = []
        async with (
            httpx.AsyncClient(base_url=server.admin_url, timeout=5) as admin,
            admin.stream("GET", "/admin/events", params=params) as response,
        ):
            server.control.apply(Drain("b"), actor="bob")  # b is idle: drained at once
            async for line in response.aiter_lines():
                if line.startswith("data: ") or line.startswith("{"):
                    lines.append(line.removeprefix("data: "))
                if len(lines) == 3:
                    break
        kinds = [(json.loads(x)["kind"], json.loads(x)["actor"]) for x in lines]
        # The command first, then the state changes it caused.
        assert kinds == [("drain", "bob"), ("state", "router"), ("state", "router")]


async def test_drain_and_preempt_through_the_admin_api_under_load_lose_nothing() -> None:
    """Draining lets in-flight work finish; preempting re-runs what had not started elsewhere
    and ends streams already under way with an error; every request is accounted for."""
    n = 60
    async with routed(SPECS, time_scale=25, retries=FAST_RETRY) as (server, _):
        traffic = asyncio.create_task(load(server, n, concurrency=12, tokens=120))
        a, b = server.core.replica("a"), server.core.replica("b")
        done = server.core.outcomes
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            await until(lambda: done[Outcome.COMPLETED] >= 4 and a.in_flight >= 2, timeout=10)
            drained = await admin.post("/admin/commands", json={"command": "drain", "replica": "a"})
            await until(lambda: done[Outcome.COMPLETED] >= 12 and b.in_flight >= 2, timeout=10)
            preempted = await admin.post(
                "/admin/commands", json={"command": "preempt", "replica": "b"}
            )
            seen = await traffic
        assert drained.json()["ok"] is True
        assert preempted.json()["ok"] is True
        assert "re-queued" in preempted.json()["message"]
        assert_counts_add_up(server, seen, n)
        for s in seen:
            if not s.ok:
                assert s.stream
                assert s.chunks > 0
                assert "preempted" in s.error
        assert a.state is ReplicaState.DRAINED
        assert b.state is ReplicaState.DRAINED
        assert server.core.replica("c").completed > 0


def test_routed_fleet_keeps_the_emulated_endpoints() -> None:
    """(helper check) the router is pointed at the emulator's real ports, not the file's."""
    config = fleet_config(Spec("a"))

    class Fake:
        def url(self, replica_id: str) -> str:
            return "http://127.0.0.1:1234"

    fleet = routed_fleet(config, Fake(), retries=FAST_RETRY)  # type: ignore[arg-type]
    assert fleet.replicas[0].endpoint == "http://127.0.0.1:1234"
    assert fleet.router.retries == FAST_RETRY


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ({"command": "weight", "replica": "a", "weight": 1e308}, "from 1e-06 to 1e+06"),
        ({"command": "batch", "replica": "a", "size": 10**12}, "from 1 to 65536"),
    ],
)
async def test_an_absurd_weight_or_batch_size_is_400_and_changes_nothing(
    command: dict[str, object], message: str
) -> None:
    async with routed(SPECS[:1]) as (server, _):
        a = server.core.replica("a")
        before = (a.weight, a.batch_size)
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            response = await admin.post("/admin/commands", json=command)
        assert response.status_code == 400
        assert message in response.json()["error"]["message"]
        assert (a.weight, a.batch_size) == before
        assert not server.control.audit


# ---- what a browser could forge -----------------------------------------------------------

DRAIN_A = b'{"command": "drain", "replica": "a"}'


def _port(server: RouterServer) -> int:
    return int(server.admin_url.rsplit(":", 1)[1])


async def _post_drain(server: RouterServer, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        return await admin.post("/admin/commands", content=DRAIN_A, headers=headers)


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    return str(error["message"])


async def test_a_command_a_web_page_could_forge_is_refused_and_changes_nothing() -> None:
    """The case found: no token, text/plain, a foreign Origin and Host (a DNS-rebound page)."""
    async with routed(SPECS[:1]) as (server, _):
        forged = {
            "Content-Type": "text/plain",
            "Origin": "http://evil.example",
            "Host": "evil.example",
        }
        message = _error(await _post_drain(server, forged), 403, "forbidden_host")
        assert "'evil.example'" in message
        assert f"127.0.0.1:{_port(server)}" in message
        assert server.core.replica("a").state is ReplicaState.ACTIVE
        assert not server.control.audit


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"],
)
async def test_a_command_not_declared_json_is_415(content_type: str | None) -> None:
    async with routed(SPECS[:1]) as (server, _):
        headers = {} if content_type is None else {"Content-Type": content_type}
        message = _error(await _post_drain(server, headers), 415, "unsupported_media_type")
        assert "application/json" in message
        assert server.core.replica("a").state is ReplicaState.ACTIVE


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON"])
async def test_json_with_parameters_or_in_another_case_is_taken(content_type: str) -> None:
    async with routed(SPECS[:1]) as (server, _):
        response = await _post_drain(server, {"Content-Type": content_type})
        assert response.status_code == 200, response.text
        assert server.core.replica("a").state is not ReplicaState.ACTIVE


@pytest.mark.parametrize(
    ("host", "origin", "code"),
    [
        ("evil.example", None, "forbidden_host"),
        ("evil.example:{port}", None, "forbidden_host"),
        ("127.0.0.1:{other}", None, "forbidden_host"),
        ("127.0.0.1", None, "forbidden_host"),  # port 80, not the listener's
        ("localhost.evil.example:{port}", None, "forbidden_host"),
        ("127.0.0.1:{port}", "http://evil.example", "forbidden_origin"),
        ("127.0.0.1:{port}", "http://127.0.0.1:{other}", "forbidden_origin"),
        ("127.0.0.1:{port}", "https://127.0.0.1:{port}", "forbidden_origin"),
        ("127.0.0.1:{port}", "null", "forbidden_origin"),
    ],
)
async def test_on_loopback_a_foreign_host_or_origin_is_403_on_every_route(
    host: str, origin: str | None, code: str
) -> None:
    async with routed(SPECS[:1]) as (server, _):
        port = _port(server)
        values = {"port": port, "other": port + 1 if port < 65535 else port - 1}
        headers = {"Host": host.format(**values), "Content-Type": "application/json"}
        if origin is not None:
            headers["Origin"] = origin.format(**values)
        _error(await _post_drain(server, headers), 403, code)
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            state = await admin.get("/admin/state", headers=headers)
        _error(state, 403, code)  # reading the state is refused too: it is not the page's
        assert server.core.replica("a").state is ReplicaState.ACTIVE


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("127.0.0.1:{port}", None),
        ("localhost:{port}", None),
        ("LOCALHOST:{port}", "http://localhost:{port}"),
        ("[::1]:{port}", "http://[::1]:{port}"),
        ("127.0.0.2:{port}", "http://127.0.0.1:{port}"),
    ],
)
async def test_on_loopback_a_loopback_host_with_the_listeners_port_is_taken(
    host: str, origin: str | None
) -> None:
    async with routed(SPECS[:1]) as (server, _):
        port = _port(server)
        headers = {"Host": host.format(port=port), "Content-Type": "application/json"}
        if origin is not None:
            headers["Origin"] = origin.format(port=port)
        response = await _post_drain(server, headers)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
async def test_the_bearer_scheme_is_read_in_any_case(scheme: str) -> None:
    async with routed(SPECS[:1], admin_token=TOKEN) as (server, _):
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            ok = await admin.get("/admin/state", headers={"Authorization": f"{scheme} {TOKEN}"})
            basic = await admin.get("/admin/state", headers={"Authorization": f"Basic {TOKEN}"})
            bare = await admin.get("/admin/state", headers={"Authorization": TOKEN})
        assert ok.status_code == 200, ok.text
        assert basic.status_code == 403
        assert bare.status_code == 403


async def test_a_token_variable_that_is_not_set_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set, the variable's token is required; not set (or empty), nothing starts."""
    fleet = fleet_config(Spec("a"))
    fleet = dataclasses.replace(
        fleet, server=dataclasses.replace(fleet.server, admin_token_env="GPUROUTER_TEST_TOKEN")
    )
    monkeypatch.delenv("GPUROUTER_TEST_TOKEN", raising=False)
    for value in (None, ""):
        if value is not None:
            monkeypatch.setenv("GPUROUTER_TEST_TOKEN", value)
        with pytest.raises(ConfigError, match=r"server\.admin_token_env: names the environment "):
            RouterServer(fleet, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
    monkeypatch.setenv("GPUROUTER_TEST_TOKEN", TOKEN)
    server = RouterServer(fleet, listen="127.0.0.1:0", admin_listen="127.0.0.1:0")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            missing = await admin.get("/admin/state")
            right = await admin.get("/admin/state", headers={"Authorization": f"Bearer {TOKEN}"})
    finally:
        await server.stop(grace_s=0)
    assert missing.status_code == 401
    assert right.status_code == 200


async def test_fleet_route_gives_the_fleet_shape_and_console_settings_without_secrets() -> None:
    """``GET /admin/fleet``: cluster, nodes with their GPUs and replicas, the console's
    settings; nothing of the broker or the listeners (an attached console draws from it)."""
    async with routed(SPECS[:2], admin_token=TOKEN) as (server, _):
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=server.admin_url, headers=headers) as admin:
            answer = await admin.get("/admin/fleet")
        fleet = server.core.fleet
    assert answer.status_code == 200
    shape = answer.json()
    assert set(shape) == {"cluster", "model", "nodes", "console"}
    assert shape["cluster"] == fleet.cluster
    assert shape["nodes"] == json.loads(json.dumps([dataclasses.asdict(n) for n in fleet.nodes]))
    assert shape["console"] == {"theme": "dark", "refresh_s": 1.0, "keys": {}}


def test_state_lists_running_requests_only_when_asked() -> None:
    """``?running=1`` adds each replica's requests (id, priority, streaming); without it the
    state is what it always was."""
    from router import ControlSurface, ManualClock, Priority, Request, RouterCore
    from router.http.admin import AdminApi
    from router.http.health import HealthMonitor

    clock = ManualClock(10.0)
    core = RouterCore(fleet_config(*SPECS[:2]), clock=clock)
    admin = AdminApi(core, ControlSurface(core), HealthMonitor(core, core.fleet.router.health))
    core.submit(Request("q0", 100, 10, clock(), priority=Priority.HIGH))
    core.submit(Request("q1", 100, 10, clock(), priority=Priority.LOW))
    core.first_byte(core.running["q0"])
    assert "running" not in admin.state()
    running = admin.state(running=True)["running"]
    assert set(running) == {"a", "b"}
    listed = sorted(
        (r["request_id"], r["priority"], r["streaming"]) for v in running.values() for r in v
    )
    assert listed == [("q0", "high", True), ("q1", "low", False)]


async def test_events_name_their_run_and_since_counts_in_the_run_it_names() -> None:
    """A router numbers its events from 1 in each run: ``since`` from another run (before a
    restart) asks for the whole trail; the state and every answer name the run."""
    async with routed(SPECS[:1]) as (server, _):
        server.control.apply(Drain("a"), actor="test")
        run = server.control.run
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            state = (await admin.get("/admin/state")).json()
            here = (await admin.get("/admin/events", params={"since": 1, "run": run})).json()
            before = (await admin.get("/admin/events", params={"since": 1, "run": "old"})).json()
            params: dict[str, str | int] = {"since": 1, "run": "old", "follow": 1}
            params["format"] = "jsonl"
            async with admin.stream("GET", "/admin/events", params=params) as stream:
                header = stream.headers["x-gpurouter-run"]
                first = json.loads(await anext(stream.aiter_lines()))
    seqs = [e.seq for e in server.control.audit]
    assert seqs[0] == 1
    assert len(seqs) > 1
    assert state["run"] == here["run"] == before["run"] == header == run
    assert [e["seq"] for e in here["events"]] == seqs[1:]
    assert [e["seq"] for e in before["events"]] == seqs
    assert first["seq"] == 1
