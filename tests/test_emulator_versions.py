"""Version switches on emulated replicas: a restart that refuses while it loads, then serves
the new version (router/emulator/versions.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from router.emulator import EmulatedFleet, VersionSwitch, parse_version_switch
from router.errors import ControlError
from tests.test_emulator_support import (
    MODEL,
    TIME_SCALE,
    Spec,
    any_ports,
    completion,
    fleet_config,
    until,
)

SPECS = (Spec("a"), Spec("b"))
FOREVER_S = 1e9
"""A load that does not end within any test: the replica stays down until the fleet stops."""


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    emulated = EmulatedFleet(fleet_config(*SPECS), time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


async def _models(url: str) -> list[str]:
    async with httpx.AsyncClient(timeout=2.0) as fresh:
        answer = await fresh.get(url + "/v1/models")
    return [card["id"] for card in answer.json()["data"]]


async def _complete(url: str, model: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as fresh:
        return await fresh.post(url + "/v1/completions", json={**completion(5, 3), "model": model})


async def test_a_replica_refuses_connections_while_it_loads_a_version(fleet: EmulatedFleet) -> None:
    """What a restarting vLLM does: the port is bound but not listening until it loaded."""
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=FOREVER_S))
    assert fleet.versions()["a"] == {"version": MODEL, "aliases": [], "loading": "m-v2"}
    with pytest.raises(httpx.ConnectError):
        await _models(fleet.url("a"))
    assert await _models(fleet.url("b")) == [MODEL]


async def test_after_the_load_it_serves_the_new_version_and_refuses_the_old(
    fleet: EmulatedFleet,
) -> None:
    url = fleet.url("a")
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=0.0))
    await until(lambda: fleet.versions()["a"]["loading"] is None)
    assert fleet.url("a") == url
    assert await _models(url) == ["m-v2"]
    assert (await _complete(url, "m-v2")).status_code == 200
    old = await _complete(url, MODEL)
    assert old.status_code == 404
    assert old.json()["error"]["param"] == "model"
    assert await _models(fleet.url("b")) == [MODEL]


async def test_a_version_can_keep_a_stable_name_beside_its_own(fleet: EmulatedFleet) -> None:
    """As ``--served-model-name m-v2 m``: clients asking for ``m`` are served throughout."""
    url = fleet.url("a")
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=0.0, aliases=(MODEL,)))
    await until(lambda: fleet.versions()["a"]["loading"] is None)
    assert await _models(url) == ["m-v2", MODEL]
    assert (await _complete(url, MODEL)).status_code == 200
    assert (await _complete(url, "m-v2")).status_code == 200


async def test_a_switch_cuts_the_requests_in_flight(fleet: EmulatedFleet) -> None:
    """A restart loses what the old process held: that is why a rollout drains first."""
    replica = fleet.replica("a")
    long = completion(10, 100_000, max_tokens=100_000)
    request = asyncio.create_task(_post(fleet, long))
    await until(lambda: replica.driver.in_flight == 1)
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=FOREVER_S))
    with pytest.raises(httpx.HTTPError):
        await request
    await asyncio.wait_for(replica.driver.wait_idle(), 2.0)
    assert replica.driver.in_flight == 0


async def _post(fleet: EmulatedFleet, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5.0) as fresh:
        return await fresh.post(fleet.url("a") + "/v1/completions", json=body)


async def test_a_second_switch_while_loading_is_refused(fleet: EmulatedFleet) -> None:
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=FOREVER_S))
    with pytest.raises(ControlError, match="already restarting onto m-v2"):
        await fleet.switch_version("a", VersionSwitch("m-v3"))


async def test_the_restart_ends_process_faults_and_keeps_the_cards(fleet: EmulatedFleet) -> None:
    await fleet.hang("a")
    await fleet.slow("a", 3.0)
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=0.0))
    await until(lambda: fleet.versions()["a"]["loading"] is None)
    faults = fleet.faults()["a"]
    assert (faults["hung"], faults["killed"], faults["slow_factor"]) == (False, False, 3.0)


async def test_healing_while_loading_does_not_bring_the_old_version_back(
    fleet: EmulatedFleet,
) -> None:
    await fleet.switch_version("a", VersionSwitch("m-v2", load_s=FOREVER_S))
    await fleet.heal("a")
    with pytest.raises(httpx.ConnectError):
        await _models(fleet.url("a"))


async def test_the_control_listener_switches_versions(fleet: EmulatedFleet) -> None:
    port = await fleet.start_control()
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=2.0) as client:
        answer = await client.post(f"{base}/versions/a", json={"version": "m-v2", "load_s": 0})
        assert answer.status_code == 202
        assert answer.json()["replica"] == "a"
        await until(lambda: fleet.versions()["a"]["loading"] is None)
        listed = (await client.get(f"{base}/versions")).json()
        assert listed["a"] == {"version": "m-v2", "aliases": [], "loading": None}
        unknown = await client.post(f"{base}/versions/zz", json={"version": "m-v2"})
        assert unknown.status_code == 404
        bad = await client.post(f"{base}/versions/a", json={"version": "no spaces"})
        assert bad.status_code == 400
        assert "'version' must be a model name" in bad.json()["error"]["message"]
        await client.post(f"{base}/versions/b", json={"version": "m-v2", "load_s": FOREVER_S})
        again = await client.post(f"{base}/versions/b", json={"version": "m-v3"})
        assert again.status_code == 409


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "expected a JSON object"),
        ({"version": ""}, "'version' must be a model name"),
        ({"version": "m", "load_s": -1}, "'load_s' must be a finite number >= 0"),
        ({"version": "m", "load_s": True}, "'load_s' must be a number"),
        ({"version": "m", "wait": True}, "unexpected key 'wait'"),
        ({"version": "m", "aliases": "m0"}, "'aliases' must be a list of model names"),
    ],
)
def test_a_bad_switch_is_refused_with_what_is_wrong(body: object, message: str) -> None:
    with pytest.raises(ControlError, match=message):
        parse_version_switch(body)


def test_a_switch_names_its_version_and_defaults_its_load() -> None:
    assert parse_version_switch({"version": "org/m-v2"}, 7.0) == VersionSwitch("org/m-v2", 7.0)
    with_alias = parse_version_switch({"version": "v2", "aliases": ["m", "v2", "m"]})
    assert with_alias.aliases == ("m",)
