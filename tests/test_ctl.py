"""`gpurouter ctl` against a real router on loopback: every subcommand changes (or reads) the
running router, and each failure exits with its documented code and one line on stderr."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from console import cli
from router.adaptive import TunerChange
from router.control import SetWeight
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.fleet_factory import closed_port
from tests.http_support import Spec, routed
from tests.test_emulator_support import MODEL, until

SPECS = (Spec("a"), Spec("b", gpu="V100-32GB"))
TOKEN = "s3cret-token"


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _no_ctl_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own admin address, token or proxies must not leak into these tests."""
    for name in ("GPUROUTER_ADMIN", "GPUROUTER_ADMIN_TOKEN", "USER", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
async def server() -> AsyncIterator[RouterServer]:
    """A router in front of two emulated replicas; no health probes, so state is the test's."""
    async with routed(SPECS) as (started, _):
        yield started


class Ctl:
    """Runs `gpurouter ctl` in-process, in a thread: the router answers on this test's loop."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *argv: str) -> Result:
        code = await asyncio.to_thread(cli.main, ["ctl", *argv])
        captured = self.capsys.readouterr()
        return Result(code, captured.out, captured.err)


@pytest.fixture
def ctl(capsys: pytest.CaptureFixture[str]) -> Ctl:
    return Ctl(capsys)


def one_error_line(result: Result) -> str:
    """The error is exactly one line on stderr, with ctl's prefix, and no traceback."""
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("gpurouter ctl: error: "), result.err
    return lines[0]


# ---- each control command changes the running router ------------------------------------


async def test_strategy_switches_the_running_router_with_params(
    server: RouterServer, ctl: Ctl
) -> None:
    url = server.admin_url
    plain = await ctl("--admin", url, "strategy", "least-connections")
    assert (plain.code, plain.err) == (0, "")
    assert plain.out == "strategy is now least-connections\n"
    assert server.core.strategy.name == "least-connections"
    with_param = await ctl(
        "--admin", url, "strategy", "capacity-aware", "--param", "stale_after_s=0.5"
    )
    assert with_param.code == 0
    assert server.core.strategy.name == "capacity-aware"
    (event,) = [e for e in server.control.audit if e.args.get("name") == "capacity-aware"]
    assert event.args["params"] == {"stale_after_s": 0.5}  # read as a number, not text


async def test_weight_pins_and_releases(server: RouterServer, ctl: Ctl) -> None:
    a = server.core.replica("a")
    pinned = await ctl("--admin", server.admin_url, "weight", "a", "2.5")
    assert pinned.code == 0
    assert (a.weight, a.weight_pinned) == (2.5, True)
    released = await ctl("--admin", server.admin_url, "weight", "a", "--release")
    assert released.code == 0
    assert "released" in released.out
    assert (a.weight, a.weight_pinned) == (a.config.weight, False)


async def test_batch_pins_and_releases(server: RouterServer, ctl: Ctl) -> None:
    b = server.core.replica("b")
    assert (await ctl("--admin", server.admin_url, "batch", "b", "3")).code == 0
    assert (b.batch_size, b.batch_pinned) == (3, True)
    assert (await ctl("--admin", server.admin_url, "batch", "b", "--release")).code == 0
    assert (b.batch_size, b.batch_pinned) == (b.config.batch_size, False)


async def test_drain_undrain_eject_readmit_and_preempt_move_the_replica(
    server: RouterServer, ctl: Ctl
) -> None:
    a = server.core.replica("a")
    url = server.admin_url
    steps = [
        (("drain", "a"), ReplicaState.DRAINED),  # idle: drained at once
        (("undrain", "a"), ReplicaState.ACTIVE),
        (("eject", "a"), ReplicaState.EJECTED),
        (("readmit", "a"), ReplicaState.ACTIVE),
        (("preempt", "a", "--include-high"), ReplicaState.DRAINED),
    ]
    for argv, state in steps:
        result = await ctl("--admin", url, *argv)
        assert (result.code, result.err) == (0, ""), argv
        assert result.out.startswith("a: "), result.out
        assert a.state is state, argv
    # The command, then the state changes it caused.
    preempt, *caused = list(server.control.audit)[-3:]
    assert (preempt.kind, preempt.args["include_high"]) == ("preempt", True)
    assert [e.message for e in caused] == [
        "a: active -> draining (by ctl)",
        "a: draining -> drained (nothing left in flight)",
    ]


async def test_the_actor_option_names_who_acted_in_the_audit_trail(
    server: RouterServer, ctl: Ctl
) -> None:
    result = await ctl("--admin", server.admin_url, "--actor", "alice", "drain", "b", "--json")
    event = json.loads(result.out)
    assert (event["kind"], event["actor"], event["ok"]) == ("drain", "alice", True)
    drain, drained = list(server.control.audit)[-3], server.control.audit[-1]
    assert (drain.kind, drain.actor) == ("drain", "alice")
    assert drained.message == "b: draining -> drained (nothing left in flight)"


async def test_the_admin_address_comes_from_the_environment(
    server: RouterServer, ctl: Ctl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUROUTER_ADMIN", server.admin_url.removeprefix("http://"))
    result = await ctl("eject", "b")
    assert result.code == 0
    assert server.core.replica("b").state is ReplicaState.EJECTED


# ---- reading: status, events, decisions ----------------------------------------------------


async def test_status_prints_a_table_of_the_fleet(server: RouterServer, ctl: Ctl) -> None:
    server.control.apply(SetWeight("a", 2.0))
    server.control.apply(SetWeight("b", None))
    result = await ctl("--admin", server.admin_url, "status")
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0] == f"cluster {server.fleet.cluster} · strategy {server.core.strategy.name}"
    assert lines[1].endswith("· in flight 0")
    assert lines[2].startswith("queue 0/")
    assert lines[3].startswith("imbalance 1.00 (excellent) · A100-80GB 1.00 · V100-32GB 1.00")
    rows: dict[str, list[str]] = {}
    for line in lines:  # the replica table's rows, not the capacity table's after them
        if line.split()[:1] in (["a"], ["b"]):
            rows.setdefault(line.split()[0], line.split())
    batch = server.core.replica("a").batch_size
    assert rows["a"][:6] == ["a", "A100-80GB", "active", f"0/{batch}", "1/2*", "0%"]
    assert rows["b"][:6] == ["b", "V100-32GB", "active", f"0/{batch}", "1/1", "0%"]
    assert rows["a"][6] == "router"  # no telemetry: the router's own accounting
    assert any(line.startswith("util from:") for line in lines)


async def test_status_json_is_the_admin_state(server: RouterServer, ctl: Ctl) -> None:
    result = await ctl("--admin", server.admin_url, "status", "--json")
    assert result.code == 0
    state = json.loads(result.out)
    assert [r["id"] for r in state["replicas"]] == ["a", "b"]
    assert state["strategy"] == server.core.strategy.name
    assert set(state["health"]) == {"a", "b"}


async def test_status_shows_learned_capacity_and_the_engines_kv_size_with_source_and_age(
    server: RouterServer, ctl: Ctl
) -> None:
    """The replica that served a request shows how long ago a completion refined its
    capacity; a pinned weight reads as the operator's figure; each KV size is the engine's,
    with the age of the reading. ``--json`` carries every field."""
    await server.engine_metrics.poll_once()
    async with httpx.AsyncClient(base_url=server.front_url, timeout=10) as front:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        assert (await front.post("/v1/completions", json=body)).status_code == 200
    served = next(r.id for r in server.core.snapshot().replicas if r.completed)
    other = "b" if served == "a" else "a"
    server.control.apply(SetWeight(other, 2.0))
    result = await ctl("--admin", server.admin_url, "status")
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["replica", "capacity"])
    rows = {line.split()[0]: line.split() for line in lines[head + 1 : head + 3]}
    # replica, req/s, "r/s", source, [age], load, KV tokens, "tok", "engine", reading's age
    assert rows[served][2:4] == ["r/s", "prior"]  # one completion: the prior still leads
    assert rows[served][4].endswith("s")  # the age: a completion refined it
    assert rows[served][5].endswith("%")
    assert rows[served][7:9] == ["tok", "engine"]
    assert rows[served][9].endswith("s")
    assert rows[other][2:5] == ["r/s", "operator", "0%"]  # never refined: no age
    assert rows[other][6:8] == ["tok", "engine"]

    as_json = json.loads((await ctl("--admin", server.admin_url, "status", "--json")).out)
    by_id = {r["id"]: r for r in as_json["replicas"]}
    engine = server.core.replica(served).engine
    assert engine is not None
    assert by_id[served]["capacity_source"] == "prior"
    assert by_id[served]["capacity_age_s"] >= 0
    assert by_id[served]["capacity_rps"] > 0
    assert by_id[served]["capacity_prior_rps"] > 0
    assert "capacity_measured_rps" in by_id[served]  # None until 50 of its own completions
    assert by_id[served]["capacity_measured_concurrency"] is None  # a card the model knows
    assert by_id[served]["kv_capacity_tokens"] == engine.kv_capacity_tokens
    assert by_id[served]["kv_capacity_source"] == "engine"
    assert by_id[served]["kv_capacity_age_s"] >= 0
    assert by_id[served]["engine_preemptions"] == 0
    assert by_id[other]["capacity_source"] == "operator"
    assert by_id[other]["capacity_age_s"] is None


async def test_events_lists_the_audit_trail_since_a_sequence_number(
    server: RouterServer, ctl: Ctl
) -> None:
    url = server.admin_url
    await ctl("--admin", url, "--actor", "alice", "weight", "a", "3")
    await ctl("--admin", url, "--actor", "bob", "undrain", "a")  # refused: a is active
    listed = await ctl("--admin", url, "events")
    lines = listed.out.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[0] == "1"
    assert "alice  weight replica=a weight=3.0  ok  a: weight set to 3" in lines[0]
    assert "bob  undrain replica=a  REFUSED  a is active, not draining or drained" in lines[1]
    since = await ctl("--admin", url, "events", "--since", "1", "--json")
    (event,) = [json.loads(line) for line in since.out.splitlines()]
    assert (event["seq"], event["actor"], event["ok"]) == (2, "bob", False)


async def test_events_follow_prints_new_events_as_they_happen_and_stops_at_count(
    server: RouterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.control.apply(SetWeight("a", 2.0), actor="alice")
    argv = ["ctl", "--admin", server.admin_url, "events", "--follow", "--count", "4"]
    follower = asyncio.ensure_future(asyncio.to_thread(cli.main, argv))
    printed = ""

    def first_line_printed() -> bool:
        nonlocal printed
        printed += capsys.readouterr().out
        return "\n" in printed

    # The backlog's one event is out: the follower is connected and waiting for more.
    await until(first_line_printed, timeout=10)
    assert not follower.done()
    server.control.apply(SetWeight("b", 4.0), actor="bob")  # one event
    server.core.drain("a")  # two state changes the router records itself: 2 more, 4 in all
    assert await asyncio.wait_for(follower, timeout=10) == 0
    lines = (printed + capsys.readouterr().out).splitlines()
    assert [line.split()[3] for line in lines] == ["alice", "bob", "router", "router"]
    assert "a: active -> draining" in lines[2]
    assert "a: draining -> drained" in lines[3]


async def test_events_follow_exits_3_when_the_router_stops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with routed(SPECS[:1]) as (server, _):
        server.control.apply(SetWeight("a", 2.0))
        argv = ["ctl", "--admin", server.admin_url, "events", "--follow"]
        follower = asyncio.ensure_future(asyncio.to_thread(cli.main, argv))
        # The backlog's event is printed: the stream is open when the router stops.
        await until(lambda: "weight" in capsys.readouterr().out, timeout=10)
    assert await asyncio.wait_for(follower, timeout=10) == 3
    err = capsys.readouterr().err
    assert err == "gpurouter ctl: error: the router closed the event stream (it is stopping)\n"


async def test_events_show_each_tuner_change_and_json_carries_its_fields(
    server: RouterServer, ctl: Ctl
) -> None:
    """A tuner change travels like any audit event: the admin API's events, then ctl."""
    change = TunerChange("b", "batch_size", 256, 192, "engine queue 40 for 2 rounds")
    server.control.on_tune([change])
    listed = await ctl("--admin", server.admin_url, "events")
    (line,) = listed.out.splitlines()
    assert line.endswith(
        "  tuner  tune  ok  b: batch_size 256 -> 192 (engine queue 40 for 2 rounds)"
    )
    as_json = await ctl("--admin", server.admin_url, "events", "--json")
    (event,) = [json.loads(line) for line in as_json.out.splitlines()]
    assert (event["actor"], event["kind"], event["ok"]) == ("tuner", "tune", True)
    assert event["args"] == {
        "replica": "b",
        "setting": "batch_size",
        "old": 256,
        "new": 192,
        "signal": "engine queue 40 for 2 rounds",
    }


async def test_events_follow_prints_a_tuner_change_as_it_happens(
    server: RouterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.control.apply(SetWeight("a", 2.0), actor="alice")
    argv = ["ctl", "--admin", server.admin_url, "events", "--follow", "--count", "2"]
    follower = asyncio.ensure_future(asyncio.to_thread(cli.main, argv))
    printed = ""

    def first_line_printed() -> bool:
        nonlocal printed
        printed += capsys.readouterr().out
        return "\n" in printed

    await until(first_line_printed, timeout=10)  # the backlog is out: the stream is open
    server.control.on_tune([TunerChange("a", "weight", 2.0, 2.6, "measured throughput")])
    assert await asyncio.wait_for(follower, timeout=10) == 0
    lines = (printed + capsys.readouterr().out).splitlines()
    assert [line.split()[3] for line in lines] == ["alice", "tuner"]
    assert lines[1].endswith("  tune  ok  a: weight 2 -> 2.6 (measured throughput)")


async def test_decisions_explain_where_requests_went(server: RouterServer, ctl: Ctl) -> None:
    async with httpx.AsyncClient(base_url=server.front_url, timeout=10) as front:
        for _ in range(2):
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            assert (await front.post("/v1/completions", json=body)).status_code == 200
    text = await ctl("--admin", server.admin_url, "decisions", "--limit", "5")
    assert text.code == 0
    lines = text.out.splitlines()
    assert len(lines) == 2
    strategy = server.core.strategy.name
    for line in lines:
        assert f"  {strategy} -> " in line
        # both candidates are explained
        assert "(a " in line
        assert "; b " in line
    as_json = await ctl("--admin", server.admin_url, "decisions", "--limit", "1", "--json")
    (decision,) = [json.loads(line) for line in as_json.out.splitlines()]
    assert decision["chosen"] in {"a", "b"}
    assert decision["request_id"] in lines[-1]


# ---- exit codes ------------------------------------------------------------------------


async def test_a_refused_command_exits_1_with_the_routers_message(
    server: RouterServer, ctl: Ctl
) -> None:
    result = await ctl("--admin", server.admin_url, "undrain", "a")
    assert result.code == 1
    assert result.out == ""
    line = one_error_line(result)
    assert line == "gpurouter ctl: error: refused: a is active, not draining or drained"
    unknown = await ctl("--admin", server.admin_url, "drain", "nope")
    assert unknown.code == 1
    assert "no replica 'nope'" in one_error_line(unknown)


async def test_an_unknown_strategy_name_is_a_bad_value_exit_2_and_nothing_is_sent(
    server: RouterServer, ctl: Ctl
) -> None:
    strategy = await ctl("--admin", server.admin_url, "strategy", "fastest")
    assert strategy.code == 2
    assert strategy.out == ""
    line = one_error_line(strategy)
    assert "unknown strategy 'fastest'; known: affinity, capacity-aware" in line
    assert not server.control.audit


async def test_connection_options_are_accepted_after_the_subcommand_too(
    server: RouterServer, ctl: Ctl
) -> None:
    """`ctl status --admin URL` works as `ctl --admin URL status` does; after wins."""
    after = await ctl("status", "--admin", server.admin_url, "--timeout", "5", "--json")
    assert after.code == 0, after.err
    assert json.loads(after.out)["strategy"] == server.core.strategy.name
    both = await ctl("--admin", "http://127.0.0.1:1", "drain", "a", "--admin", server.admin_url)
    assert both.code == 0, both.err
    drain = next(e for e in server.control.audit if e.kind == "drain")
    assert drain.actor == "ctl"


@pytest.mark.parametrize(
    "argv",
    [
        ["weight", "a"],  # neither W nor --release
        ["weight", "a", "2", "--release"],  # both
        ["batch", "a"],
    ],
)
async def test_weight_and_batch_need_exactly_one_of_a_value_or_release(
    server: RouterServer, ctl: Ctl, argv: list[str]
) -> None:
    result = await ctl("--admin", server.admin_url, *argv)
    assert result.code == 2
    assert "or --release" in one_error_line(result)
    assert not server.control.audit  # nothing was sent


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["weight", "a", "-1"], "argument W: must be a positive number"),
        (["weight", "a", "inf"], "argument W: must be a positive number"),
        (["weight", "a", "1e308"], "argument W: weight must be a number from 1e-06 to 1e+06"),
        (["weight", "a", "1e-9"], "argument W: weight must be a number from 1e-06 to 1e+06"),
        (["batch", "a", "0"], "argument N: must be >= 1"),
        (["batch", "a", "100000"], "argument N: batch size must be a whole number from 1 to"),
        (["batch", "a", "two"], "argument N: must be an integer"),
        (["strategy", "random", "--param", "novalue"], "expected K=V"),
        (["events", "--count", "0"], "must be >= 1"),
        (["drain"], "required: REPLICA"),
        (["fly"], "invalid choice: 'fly'"),
    ],
)
def test_usage_errors_exit_2_with_one_prefixed_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    """Argparse refuses these before any request is made (nothing listens on this port)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["ctl", "--admin", f"127.0.0.1:{closed_port()}", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1, err
    assert error_lines[0].startswith("gpurouter ctl: error: ")
    assert fragment in error_lines[0]
    assert "Traceback" not in err


async def test_a_parameter_the_strategy_does_not_take_is_refused_by_the_router(
    server: RouterServer, ctl: Ctl
) -> None:
    result = await ctl("--admin", server.admin_url, "strategy", "random", "--param", "x=1")
    assert result.code == 1
    assert "takes no parameter 'x'" in one_error_line(result)
    assert server.core.strategy.name != "random"


async def test_nothing_listening_exits_3(ctl: Ctl) -> None:
    result = await ctl("--admin", f"http://127.0.0.1:{closed_port()}", "status")
    assert result.code == 3
    assert result.out == ""
    assert "cannot connect to http://127.0.0.1:" in one_error_line(result)


async def test_a_router_that_does_not_answer_in_time_exits_3(ctl: Ctl) -> None:
    """A listener that accepts connections but never answers: the --timeout ends the wait."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = await ctl("--admin", f"127.0.0.1:{port}", "--timeout", "0.2", "status")
    assert result.code == 3
    assert "did not answer within 0.2s" in one_error_line(result)


async def test_an_address_that_is_not_an_admin_api_exits_3(server: RouterServer, ctl: Ctl) -> None:
    """The front door is a real HTTP server, but not the admin API."""
    result = await ctl("--admin", server.front_url, "status")
    assert result.code == 3
    assert "answered HTTP 404 to /admin/state" in one_error_line(result)


async def test_a_bad_admin_url_exits_2(ctl: Ctl) -> None:
    result = await ctl("--admin", "ftp://127.0.0.1:1", "status")
    assert result.code == 2
    assert "bad admin URL" in one_error_line(result)


async def test_with_a_token_on_the_router_none_or_a_wrong_one_exits_4(
    ctl: Ctl, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with routed(SPECS[:1], admin_token=TOKEN) as (server, _):
        url = server.admin_url
        missing = await ctl("--admin", url, "drain", "a")
        wrong = await ctl("--admin", url, "--token", "nope", "drain", "a")
        assert server.core.replica("a").state is ReplicaState.ACTIVE
        monkeypatch.setenv("GPUROUTER_ADMIN_TOKEN", TOKEN)
        from_env = await ctl("--admin", url, "drain", "a")
        from_option = await ctl("--admin", url, "--token", TOKEN, "undrain", "a")
        state = server.core.replica("a").state
    assert missing.code == 4
    assert "needs a token: pass --token or set GPUROUTER_ADMIN_TOKEN" in one_error_line(missing)
    assert wrong.code == 4
    assert "refused the token" in one_error_line(wrong)
    assert from_env.code == 0
    assert from_option.code == 0
    assert state is ReplicaState.ACTIVE


def test_the_help_epilog_lists_every_exit_code_the_docs_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["ctl", "--help"])
    help_text = capsys.readouterr().out
    for code in range(5):
        assert f"\n  {code}  " in help_text
