"""Faults set for a version (router/emulator/faults.py): ``slow`` and ``fail`` given a
``version`` stand for that build and act only while the replica serves it; a replica the
fleet file gives a ``version`` serves it, under its ``model`` too."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from router.emulator import EmulatedFleet, VersionSwitch
from router.emulator.faults import FaultCommand, parse_fault_command
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


@pytest.fixture
async def fleet() -> AsyncIterator[EmulatedFleet]:
    config = fleet_config(*SPECS)
    node = config.nodes[0]
    versioned = dataclasses.replace(node.replicas[1], version="m-v2")
    config = dataclasses.replace(
        config, nodes=(dataclasses.replace(node, replicas=(node.replicas[0], versioned)),)
    )
    emulated = EmulatedFleet(config, time_scale=TIME_SCALE, ports=any_ports(SPECS))
    async with emulated:
        yield emulated


async def _restart(fleet: EmulatedFleet, replica: str, version: str) -> None:
    await fleet.switch_version(replica, VersionSwitch(version, load_s=0.0, aliases=(MODEL,)))
    await until(lambda: fleet.versions()[replica]["loading"] is None)


async def _status(fleet: EmulatedFleet, replica: str) -> int:
    async with httpx.AsyncClient(timeout=5.0) as client:
        body = {**completion(5, 3), "model": MODEL}
        return (await client.post(fleet.url(replica) + "/v1/completions", json=body)).status_code


async def test_a_fault_set_for_a_version_acts_only_while_that_version_is_served(
    fleet: EmulatedFleet,
) -> None:
    await fleet.apply("a", FaultCommand("fail", fraction=1.0, version="m-v2"))
    assert await _status(fleet, "a") == 200  # it serves the model, not m-v2
    await _restart(fleet, "a", "m-v2")
    assert await _status(fleet, "a") == 500
    await _restart(fleet, "a", MODEL)
    assert await _status(fleet, "a") == 200
    assert fleet.faults()["a"]["of_version"] == "m-v2"


async def test_a_fault_set_for_no_version_outlasts_a_restart(fleet: EmulatedFleet) -> None:
    await fleet.apply("a", FaultCommand("fail", fraction=1.0))
    await _restart(fleet, "a", "m-v2")
    assert await _status(fleet, "a") == 500


def test_only_slow_and_fail_take_a_version_and_it_must_be_a_model_name() -> None:
    with pytest.raises(ControlError, match="only 'slow' and 'fail'"):
        parse_fault_command({"fault": "kill", "version": "m-v2"})
    with pytest.raises(ControlError, match="must be a model name"):
        parse_fault_command({"fault": "fail", "fraction": 1, "version": "m v2"})
    command = parse_fault_command({"fault": "fail", "fraction": 1, "version": "m-v2"})
    assert command.version == "m-v2"


async def test_a_replica_given_a_version_serves_it_and_its_model(fleet: EmulatedFleet) -> None:
    async with httpx.AsyncClient(timeout=2.0) as client:
        answer = await client.get(fleet.url("b") + "/v1/models")
    assert [card["id"] for card in answer.json()["data"]] == ["m-v2", MODEL]
