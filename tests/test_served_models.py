"""Model-aware routing: the router learns what each replica serves from the replica's own
``/v1/models`` and routes by it; a replica that does not serve the model the fleet file
declares for it is flagged everywhere and gets none of that model's requests.

The HTTP tests run the real router in front of emulated replicas on loopback. An emulated
replica serves the model of the fleet it was started from, so a replica "serving another
model" is one started from a fleet whose file names another model than the router's file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from console import cli
from router.config.schema import FleetConfig, ReplicaConfig
from router.control import Drain, Eject, Readmit, Undrain
from router.emulator import EmulatedFleet
from router.emulator.replica import EmulatedReplica
from router.http.served_models import ModelListError, parse_model_list
from router.http.server import RouterServer
from router.pool import ReplicaPool
from router.replica import Replica, ReplicaState
from router.request import Request, estimate_cost
from router.strategies import STRATEGIES
from tests.http_support import QUIET_HEALTH, openai_client, routed_fleet
from tests.strategy_helpers import Spec as StrategySpec
from tests.strategy_helpers import attach, config, dispatch
from tests.test_emulator_support import MODEL, Spec, any_ports, fleet_config, metric, until

OTHER = "Qwen2.5-7B"
"""What replica ``b`` really serves (a profile the emulator knows, as MODEL is)."""
MISMATCH = f"serves {OTHER}, fleet file says {MODEL}"
SPECS = (Spec("a"), Spec("b"))
HINT = {"gpurouter": {"prompt_tokens": 20, "output_tokens": 4}}


def changed(config: FleetConfig, replica: str, **changes: Any) -> FleetConfig:
    """The fleet with ``changes`` made to one replica's configuration."""

    def one(r: ReplicaConfig) -> ReplicaConfig:
        return dataclasses.replace(r, **changes) if r.id == replica else r

    nodes = tuple(
        dataclasses.replace(n, replicas=tuple(map(one, n.replicas))) for n in config.nodes
    )
    return dataclasses.replace(config, nodes=nodes)


@asynccontextmanager
async def mismatched(**settings: Any) -> AsyncIterator[tuple[RouterServer, EmulatedFleet]]:
    """A router whose fleet file says both replicas serve MODEL, in front of emulated
    replicas where ``b`` serves OTHER; round-robin, so without model awareness ``b`` would
    get every other request."""
    declared = fleet_config(*SPECS)
    actual = changed(declared, "b", model=OTHER)
    settings.setdefault("strategy", "round-robin")
    async with EmulatedFleet(actual, time_scale=100.0, ports=any_ports(SPECS)) as emulated:
        server = RouterServer(
            routed_fleet(declared, emulated, **settings),
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
        )
        await server.start()
        try:
            yield server, emulated
        finally:
            await server.stop(grace_s=0)


@asynccontextmanager
async def restarted(emulated: EmulatedFleet, replica: str, model: str) -> AsyncIterator[None]:
    """Stop an emulated replica and start it again on the same port, serving ``model``."""
    old = emulated.replicas[replica]
    await old.stop()
    config = dataclasses.replace(old.config, model=model)
    new = EmulatedReplica(
        config, emulated.catalog, host=old.host, port=old.port, time_scale=emulated.time_scale
    )
    await new.start()
    try:
        yield
    finally:
        await new.stop()


async def served_by(server: RouterServer, model: str, n: int) -> list[str]:
    """Send ``n`` completions for ``model`` at once; the replica that served each."""
    client = openai_client(server)
    try:
        responses = await asyncio.gather(
            *(
                client.completions.with_raw_response.create(
                    model=model, prompt="hi", max_tokens=4, extra_body=HINT
                )
                for _ in range(n)
            )
        )
    finally:
        await client.close()
    return [r.headers["x-gpurouter-replica"] for r in responses]


# ---- the routing rule, pure ---------------------------------------------------------------


def replica(served: tuple[str, ...] | None, declared: str = MODEL) -> Replica:
    r = Replica(0, dataclasses.replace(config(0, StrategySpec()), model=declared), 1.0, 4)
    r.served_models = served
    return r


@pytest.mark.parametrize(
    ("served", "model", "serves"),
    [
        (None, MODEL, True),  # not asked yet: the fleet file's declaration stands
        (None, OTHER, False),
        ((MODEL,), MODEL, True),
        ((OTHER,), MODEL, False),  # answered: what it said, not what the file says
        ((OTHER,), OTHER, True),  # and it takes what it does serve
        ((MODEL, OTHER), OTHER, True),  # several names (aliases, adapters)
        ((), MODEL, False),  # an empty list serves nothing
    ],
)
def test_a_replica_takes_a_model_by_what_it_said_else_by_the_fleet_file(
    served: tuple[str, ...] | None, model: str, serves: bool
) -> None:
    r = replica(served)
    assert r.serves(model) is serves
    request = Request("q", 10, 10, 0.0, model=model)
    assert r.fits(request) is serves
    assert r.can_take(request) is serves


@pytest.mark.parametrize(
    ("served", "flag"),
    [
        (None, None),
        ((MODEL,), None),
        ((MODEL, OTHER), None),
        ((OTHER,), MISMATCH),
        ((OTHER, "x"), f"serves {OTHER}, x, fleet file says {MODEL}"),
        ((), f"serves nothing, fleet file says {MODEL}"),
    ],
)
def test_a_replica_is_flagged_when_it_does_not_serve_its_declared_model(
    served: tuple[str, ...] | None, flag: str | None
) -> None:
    assert replica(served).model_mismatch == flag


NAMES = ("m1", "m2", "m3")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(STRATEGIES)),
    served=st.lists(
        st.none() | st.lists(st.sampled_from(NAMES), unique=True).map(tuple),
        min_size=1,
        max_size=8,
    ),
    asks=st.lists(st.sampled_from(NAMES), min_size=1, max_size=30),
)
def test_every_strategy_picks_only_replicas_that_serve_the_model(
    name: str, served: list[tuple[str, ...] | None], asks: list[str]
) -> None:
    """Whatever each replica serves (declared ``m1``; some never asked), no strategy ever
    picks one that does not serve the request's model; picked requests stay running, so the
    pool fills as it would under load."""
    pool = ReplicaPool(
        [dataclasses.replace(config(i, StrategySpec()), model="m1") for i in range(len(served))]
    )
    for r, names in zip(pool, served, strict=True):
        r.served_models = names
        pool.changed(r)
    strategy = attach(name, pool)
    for i, model in enumerate(asks):
        request = Request(f"q{i}", 50, 50, 0.0, model=model, cost=estimate_cost(50, 50))
        chosen = strategy.pick(request, 0.0)
        if chosen is not None:
            assert chosen.serves(model), (name, chosen.id, chosen.models, model)
            dispatch(pool, chosen, request)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b'{"object": "list", "data": [{"id": "a", "root": "/m"}, {"id": "b"}]}', ("a", "b")),
        (b'{"data": [{"id": "a"}, {"id": "a"}]}', ("a",)),
        (b'{"data": []}', ()),
    ],
)
def test_a_model_list_reads_as_its_ids(body: bytes, names: tuple[str, ...]) -> None:
    assert parse_model_list(body) == names


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"<html>", "not JSON"),
        (b'["a"]', "no `data` array"),
        (b'{"data": {"id": "a"}}', "no `data` array"),
        (b'{"data": [{"name": "a"}]}', "has no string `id`"),
        (b'{"data": [{"id": ""}]}', "has no string `id`"),
    ],
)
def test_a_malformed_model_list_is_refused_with_what_is_wrong(body: bytes, error: str) -> None:
    with pytest.raises(ModelListError, match=error):
        parse_model_list(body)


# ---- over HTTP, with emulated replicas ----------------------------------------------------


async def test_a_replica_serving_another_model_gets_none_of_its_declared_models_requests() -> None:
    async with mismatched() as (server, _):
        assert await served_by(server, MODEL, 20) == ["a"] * 20
        b = server.core.replica("b")
        assert (b.completed, b.failed) == (0, 0)  # none sent there, none refused there
        assert await served_by(server, OTHER, 4) == ["b"] * 4  # moved by name


async def test_the_router_lists_what_the_replicas_serve_and_a_404_says_so() -> None:
    async with mismatched() as (server, _):
        client = openai_client(server)
        try:
            listed = [m.id for m in (await client.models.list()).data]
            with pytest.raises(openai.NotFoundError) as caught:
                await client.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
        finally:
            await client.close()
    assert listed == [MODEL, OTHER]
    assert caught.value.status_code == 404
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found"
    assert error["message"] == f"The model `gpt-9` does not exist here; served: {MODEL}, {OTHER}"


async def test_a_model_that_no_replica_serves_is_a_404_though_the_fleet_file_names_it() -> None:
    declared = fleet_config(Spec("a"))
    async with EmulatedFleet(changed(declared, "a", model=OTHER), ports={"a": 0}) as em:
        server = RouterServer(
            routed_fleet(declared, em), listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
        )
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.front_url) as http:
                body = {"model": MODEL, "prompt": "hi", **HINT}
                response = await http.post("/v1/completions", json=body)
        finally:
            await server.stop(grace_s=0)
    assert response.status_code == 404
    assert response.json()["error"]["message"].endswith(f"served: {OTHER}")


async def test_the_mismatch_is_flagged_in_the_admin_state_metrics_and_ctl_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GPUROUTER_ADMIN", "GPUROUTER_ADMIN_TOKEN", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with mismatched() as (server, _):
        async with httpx.AsyncClient() as http:
            state = (await http.get(server.admin_url + "/admin/state")).json()
            text = (await http.get(server.front_url + "/metrics")).text
        code = await asyncio.to_thread(cli.main, ["ctl", "--admin", server.admin_url, "status"])
    out = capsys.readouterr().out
    a, b = state["replicas"]
    assert (a["model_mismatch"], b["model_mismatch"]) == (None, MISMATCH)
    assert (b["model"], b["served_models"]) == (MODEL, [OTHER])
    section = state["served_models"]["b"]
    assert section["declared"] == MODEL
    assert section["served"] == [OTHER]
    assert section["mismatch"] == MISMATCH
    assert section["error"] is None
    gauge = "gpurouter_replica_model_mismatch"
    assert metric(text, f'{gauge}{{declared="{MODEL}",replica="b",served="{OTHER}"}}') == 1.0
    assert metric(text, f'{gauge}{{declared="{MODEL}",replica="a",served="{MODEL}"}}') == 0.0
    assert code == 0
    assert f"model: b {MISMATCH}" in out.splitlines()
    assert "model: a" not in out


async def test_a_replica_that_changes_what_it_serves_is_noticed_at_the_next_poll() -> None:
    async with mismatched() as (server, emulated):
        b = server.core.replica("b")
        async with restarted(emulated, "b", MODEL):
            assert b.served_models == (OTHER,)  # until asked again, its last answer stands
            await server.served_models.poll_once()
            assert (b.served_models, b.model_mismatch) == ((MODEL,), None)
            assert sorted(set(await served_by(server, MODEL, 4))) == ["a", "b"]
            client = openai_client(server)
            with pytest.raises(openai.NotFoundError):
                await client.completions.create(model=OTHER, prompt="hi", max_tokens=2)
            await client.close()
        # Down now: a failed ask is recorded and forgets nothing.
        await server.served_models.poll_once()
        assert b.served_models == (MODEL,)
        assert "/v1/models" in server.served_models.status()["b"]["error"]


@pytest.mark.parametrize(
    ("out", "back"), [(Eject("b"), Readmit("b")), (Drain("b"), Undrain("b"))], ids=str
)
async def test_a_replica_back_in_service_is_asked_at_once(out: Any, back: Any) -> None:
    # The periodic poll is an hour away: only the return to service can ask.
    quiet = dataclasses.replace(QUIET_HEALTH, models_interval_s=3600.0)
    async with mismatched(health=quiet) as (server, emulated):
        b = server.core.replica("b")
        assert server.control.apply(out).ok
        async with restarted(emulated, "b", MODEL):
            assert server.control.apply(back).ok
            assert b.state is ReplicaState.ACTIVE
            await until(lambda: b.served_models == (MODEL,))
            assert b.model_mismatch is None


async def test_without_discovery_the_fleet_file_is_trusted() -> None:
    async with mismatched(health=dataclasses.replace(QUIET_HEALTH, models_interval_s=0.0)) as (
        server,
        _,
    ):
        b = server.core.replica("b")
        assert b.served_models is None
        assert server.served_models.names() == [MODEL]


@contextmanager
def _refusing(url: str) -> Iterator[None]:
    """Keep a stopped replica's port bound and not listening: a connection to it is refused,
    and no other test's server, started meanwhile by another worker of the suite, is given
    the port. Once, in the whole suite, the ask there ran out of time instead of being
    refused, which a port taken by a server that does not answer gives; alone under four
    busy loops on two cores it was refused six times of six."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", urlsplit(url).port or 0))
        yield
    finally:
        holder.close()


async def test_a_replica_that_does_not_answer_is_judged_by_the_fleet_file() -> None:
    """Its declared model stands, and why the ask failed is in the admin state."""
    declared = fleet_config(*SPECS)
    async with EmulatedFleet(declared, ports=any_ports(SPECS)) as emulated:
        down = emulated.url("b")
        await emulated.replicas["b"].stop()
        with _refusing(down):
            server = RouterServer(
                routed_fleet(declared, emulated), listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
            )
            await server.start()
            try:
                async with httpx.AsyncClient() as http:
                    state = (await http.get(server.admin_url + "/admin/state")).json()
                b = server.core.replica("b")
                assert b.serves(MODEL)
                assert server.served_models.names() == [MODEL]
            finally:
                await server.stop(grace_s=0)
    section = state["served_models"]["b"]
    assert (section["served"], section["mismatch"], section["age_s"]) == (None, None, None)
    assert section["error"].startswith(f"{down}/v1/models: Cannot connect")
    assert state["served_models"]["a"]["served"] == [MODEL]
