"""The admin API's JSON back into the console's types: what the attached console draws is
what the console in the router's process would draw from the same router."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from console.attach.rebuild import rebuild
from console.attach.state import fleet_from_json, state_from_json
from router.control import Drain, Event
from router.http.admin import AdminApi, fleet_shape
from router.http.health import HealthMonitor
from router.in_flight import in_flight
from router.strategies import Explanation
from tests.console_helpers import loaded_rig, telemetry_for


def over_the_wire(data: object) -> object:
    """What the admin API sends and a client parses (orjson, as send_json writes it)."""
    return orjson.loads(orjson.dumps(data))


def admin_for_rig() -> tuple[AdminApi, HealthMonitor]:
    rig = loaded_rig()
    status = telemetry_for(rig)
    health = HealthMonitor(rig.core, rig.core.fleet.router.health)
    return AdminApi(rig.core, rig.control, health, telemetry=lambda: status), health


def test_the_admin_state_round_trips_into_the_snapshot_telemetry_and_running_requests() -> None:
    """Requests in flight at every priority, some streaming, a queue, telemetry with GPU
    readings, a replica failing: every field comes back equal."""
    api, health = admin_for_rig()
    health.answered[1] = False
    core = api.core
    state = state_from_json(over_the_wire(api.state(running=True)))  # type: ignore[arg-type]
    assert state.snapshot == core.snapshot()
    assert api.telemetry is not None
    assert state.telemetry == api.telemetry()
    assert state.failing == frozenset({"r1"})
    assert state.running == {r.id: tuple(in_flight(core, r)) for r in core.pool}
    assert any(i.streaming for items in state.running.values() for i in items)


def test_a_state_without_telemetry_or_running_reads_as_telemetry_off_and_nothing_listed() -> None:
    api, _ = admin_for_rig()
    api.telemetry = None
    state = state_from_json(over_the_wire(api.state()))  # type: ignore[arg-type]
    assert state.telemetry.broker == "disabled"
    assert state.running == {}


def test_the_fleet_route_round_trips_into_the_fleet_the_console_draws() -> None:
    api, _ = admin_for_rig()
    fleet = api.core.fleet
    back = fleet_from_json(over_the_wire(fleet_shape(fleet)))  # type: ignore[arg-type]
    assert back.nodes == fleet.nodes
    assert (back.cluster, back.model, back.console) == (fleet.cluster, fleet.model, fleet.console)


def test_audit_events_and_decisions_round_trip() -> None:
    api, _ = admin_for_rig()
    api.control.apply(Drain("r0"), actor="alice")
    for event in api.control.audit:
        assert rebuild(Event, over_the_wire(event.to_dict())) == event
    decisions = list(api.core.decisions)
    assert decisions
    for d in decisions:
        assert rebuild(Explanation, over_the_wire(dataclasses.asdict(d))) == d


def test_a_wrong_field_is_an_error_naming_where_it_is_and_unknown_keys_are_skipped() -> None:
    api, _ = admin_for_rig()
    data = over_the_wire(api.state())
    assert isinstance(data, dict)
    data["from_a_newer_router"] = {"anything": 1}
    data["replicas"][2]["in_flight"] = "three"
    with pytest.raises(ValueError, match=r"FleetSnapshot\.replicas\[2\]\.in_flight"):
        state_from_json(data)
    del data["replicas"][2]["in_flight"]
    with pytest.raises(ValueError, match="`in_flight` is missing"):
        state_from_json(data)
