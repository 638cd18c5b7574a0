"""The control surface: one place for every operator action, each audited and published."""

from __future__ import annotations

import random
import re

import pytest

from router.clock import ManualClock
from router.control import (
    COMMANDS,
    ControlSurface,
    Drain,
    Eject,
    Event,
    Preempt,
    SetStrategy,
    SetWeight,
    parse_command,
)
from router.core import RouterCore
from router.errors import ControlError
from router.request import Request
from tests.fleet_factory import make_fleet


def surface() -> tuple[ControlSurface, RouterCore, ManualClock]:
    clock = ManualClock()
    core = RouterCore(make_fleet(), clock=clock, rng=random.Random(0))
    return ControlSurface(core, wall_clock=lambda: 1_700_000_000.0), core, clock


def test_every_command_kind_parses_from_a_mapping() -> None:
    samples: dict[str, dict[str, object]] = {
        "strategy": {"name": "round-robin"},
        "weight": {"replica": "r0", "weight": 2.5},
        "batch": {"replica": "r0", "size": None},
        "drain": {"replica": "r0"},
        "undrain": {"replica": "r0"},
        "preempt": {"replica": "r0", "include_high": True},
        "eject": {"replica": "r0"},
        "readmit": {"replica": "r0"},
        "split": {"model": "m", "old": "m", "new": "m-v2", "share": 0.25},
        "unsplit": {},
    }
    assert set(samples) == set(COMMANDS)
    for name, args in samples.items():
        assert isinstance(parse_command({"command": name, **args}), COMMANDS[name])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"command": "explode"}, "unknown command 'explode'"),
        ({}, "unknown command None"),
        ({"command": "drain"}, "missing 1 required positional argument: 'replica'"),
        ({"command": "drain", "replica": "r0", "force": True}, "unexpected keyword argument"),
        ({"command": "weight", "replica": "r0", "weight": "heavy"}, "weight must be int or float"),
        ({"command": "batch", "replica": "r0", "size": 2.5}, "size must be int or null"),
        ({"command": "batch", "replica": "r0", "size": True}, "size must be int or null"),
        ({"command": "drain", "replica": 3}, "replica must be str"),
    ],
)
def test_malformed_commands_are_refused_with_a_clear_message(
    data: dict[str, object], message: str
) -> None:
    with pytest.raises(ControlError, match=re.escape(message)):
        parse_command(data)


ABSURD = [
    ({"command": "weight", "replica": "r0", "weight": 1e308}, "from 1e-06 to 1e+06"),
    ({"command": "weight", "replica": "r0", "weight": 1e-300}, "from 1e-06 to 1e+06"),
    ({"command": "weight", "replica": "r0", "weight": float("nan")}, "from 1e-06 to 1e+06"),
    ({"command": "weight", "replica": "r0", "weight": float("inf")}, "from 1e-06 to 1e+06"),
    ({"command": "weight", "replica": "r0", "weight": 10**400}, "not 10000000000000000000... (401"),
    ({"command": "batch", "replica": "r0", "size": 2**63}, "from 1 to 65536"),
    ({"command": "batch", "replica": "r0", "size": 0}, "from 1 to 65536"),
    (
        {"command": "strategy", "name": "affinity", "params": {"balance": float("nan")}},
        "finite numbers",
    ),
    (
        {"command": "strategy", "name": "affinity", "params": {"x": [float("-inf")]}},
        "finite numbers",
    ),
    ({"command": "split", "model": "m", "old": "m", "new": "v2", "share": 1.5}, "within 0..1"),
    (
        {"command": "split", "model": "m", "old": "m", "new": "v2", "share": float("nan")},
        "within 0..1",
    ),
    ({"command": "split", "model": "m", "old": "m", "new": "m", "share": 0.5}, "two versions"),
]


@pytest.mark.parametrize(("data", "message"), ABSURD)
def test_absurd_values_are_refused_when_parsed(data: dict[str, object], message: str) -> None:
    """The admin API and the MQTT control topic read commands with parse_command."""
    with pytest.raises(ControlError, match=re.escape(message)):
        parse_command(data)


@pytest.mark.parametrize(("data", "message"), ABSURD)
def test_absurd_values_are_refused_when_applied_and_change_nothing(
    data: dict[str, object], message: str
) -> None:
    """The console builds commands in code: the surface checks them itself."""
    control, core, _ = surface()
    name = data["command"]
    args = {k: v for k, v in data.items() if k != "command"}
    command = COMMANDS[str(name)](**args)  # type: ignore[arg-type]  # the point: unchecked
    before = (core.replica("r0").weight, core.replica("r0").batch_size, core.strategy.name)
    event = control.apply(command, actor="console")
    assert not event.ok
    assert message in event.message
    assert (core.replica("r0").weight, core.replica("r0").batch_size, core.strategy.name) == before


def test_the_widest_values_are_applied() -> None:
    control, core, _ = surface()
    assert control.apply(parse_command({"command": "weight", "replica": "r0", "weight": 1e6})).ok
    assert control.apply(parse_command({"command": "batch", "replica": "r0", "size": 65536})).ok
    assert (core.replica("r0").weight, core.replica("r0").batch_size) == (1e6, 65536)


def test_an_applied_command_changes_the_core_and_is_audited() -> None:
    control, core, _ = surface()
    event = control.apply(SetWeight("r1", 7.0), actor="alice")
    assert core.replica("r1").weight == 7.0
    assert event == Event(
        1,
        1_700_000_000.0,
        "alice",
        "weight",
        {"replica": "r1", "weight": 7.0},
        True,
        "r1: weight set to 7",
    )
    assert list(control.audit) == [event]


def test_a_split_is_a_command_set_and_ended_through_the_surface() -> None:
    """A canary's share travels as a command (so every router applies it): the core's split
    is set, then ended, each audited."""
    control, core, _ = surface()
    split = parse_command(
        {"command": "split", "model": "m", "old": "m", "new": "m-v2", "share": 0.25}
    )
    event = control.apply(split, actor="rollout")
    assert event.ok, event.message
    assert event.message == "split: 25% of m to m-v2, the rest to m"
    assert core.split is not None
    assert core.split.to_dict() == {"model": "m", "old": "m", "new": "m-v2", "share": 0.25}
    ended = control.apply(parse_command({"command": "unsplit"}), actor="rollout")
    assert ended.ok
    assert core.split is None
    assert [e.kind for e in control.audit] == ["split", "unsplit"]


def test_a_refused_command_is_audited_as_failed_and_changes_nothing() -> None:
    control, core, _ = surface()
    event = control.apply(SetStrategy("fastest"))
    assert not event.ok
    assert "unknown strategy 'fastest'" in event.message
    assert core.strategy.name == "weighted-least-connections"
    assert control.audit[-1] is event


def test_subscribers_see_commands_and_state_changes_the_router_makes_itself() -> None:
    control, core, clock = surface()
    seen: list[Event] = []
    unsubscribe = control.subscribe(seen.append)
    core.submit(Request("q0", 10, 10, arrival=clock()))
    (a,) = core.running.values()
    control.apply(Drain(a.replica.id))
    core.complete(a)
    kinds = [(e.kind, e.message) for e in seen]
    # The command first, then the change it caused: the trail reads in causal order.
    assert kinds == [
        ("drain", f"{a.replica.id}: draining, 1 in flight"),
        ("state", f"{a.replica.id}: active -> draining (by operator)"),
        ("state", f"{a.replica.id}: draining -> drained (nothing left in flight)"),
    ]
    assert [e.seq for e in seen] == [1, 2, 3]
    assert list(control.audit) == seen
    unsubscribe()
    control.apply(Preempt(a.replica.id))
    assert len(seen) == 3


def test_a_state_change_says_why_in_the_trail() -> None:
    """An operator's ejection names its actor; one the router makes names its cause."""
    control, core, _ = surface()
    command = control.apply(Eject("r0"), actor="alice")
    core.eject("r1", "5 failed requests in a row: r1: cannot connect")
    states = [e for e in control.audit if e.kind == "state"]
    assert [e.seq for e in control.audit] == [1, 2, 3]
    assert control.audit[0] is command
    assert [e.message for e in states] == [
        "r0: active -> ejected (by alice)",
        "r1: active -> ejected (5 failed requests in a row: r1: cannot connect)",
    ]
    assert states[1].args["reason"] == "5 failed requests in a row: r1: cannot connect"
    assert core.replica("r1").state_reason == "5 failed requests in a row: r1: cannot connect"


def test_event_serialises_to_plain_data() -> None:
    control, _, _ = surface()
    event = control.apply(parse_command({"command": "strategy", "name": "round-robin"}))
    assert event.to_dict()["args"] == {"name": "round-robin", "params": {}}
