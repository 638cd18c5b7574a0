"""Faults set for a version (router/emulator/faults.py): ``slow`` and ``fail`` given a
``version`` stand for that build, and end when the replica restarts onto another; a
replica the fleet file gives a ``version`` serves it, under its ``model`` too."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from router.emulator import EmulatedFleet, VersionSwitch
from router.emulator.faults import FaultCommand, parse_fault_command
from router.errors import ControlError
from tests.test_emulator_support import MODEL, TIME_SCALE, Spec, any_ports, fleet_config, until

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
    await fleet.switch_version(replica, VersionSwitch(version, load_s=0.0))
    await until(lambda: fleet.versions()[replica]["loading"] is None)


async def test_a_fault_set_for_a_version_ends_when_another_is_loaded(fleet: EmulatedFleet) -> None:
    await _restart(fleet, "a", "m-v2")
    await fleet.apply("a", FaultCommand("fail", fraction=1.0, version="m-v2"))
    await fleet.apply("b", FaultCommand("slow", factor=4.0))
    await _restart(fleet, "a", MODEL)
    await _restart(fleet, "b", "m-v3")
    a, b = fleet.faults()["a"], fleet.faults()["b"]
    assert (a["fail_fraction"], a["of_version"]) == (0.0, None)
    assert b["slow_factor"] == 4.0  # set for no version: the card's, it outlasts restarts


async def test_a_fault_set_for_the_version_loaded_again_stays(fleet: EmulatedFleet) -> None:
    await fleet.apply("a", FaultCommand("slow", factor=2.0, version=MODEL))
    await _restart(fleet, "a", MODEL)
    assert fleet.faults()["a"]["slow_factor"] == 2.0


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
