"""Every tuner change is an audit event: actor ``tuner``, kind ``tune``, the replica, the
setting, old and new value and the signal that moved it, in the order the tuner made them."""

from __future__ import annotations

import logging
import random

import pytest

from router.adaptive import TunerChange
from router.clock import ManualClock
from router.control import ControlSurface, Event, SetWeight
from router.core import RouterCore
from tests.fleet_factory import make_fleet
from tests.tuner_changes import drive_a_tuner_change, tuning_core

WALL = 1_700_000_000.0


def test_a_tuner_change_is_one_tune_event_by_the_tuner_with_every_field() -> None:
    core = RouterCore(make_fleet(), clock=ManualClock(), rng=random.Random(0))
    control = ControlSurface(core, wall_clock=lambda: WALL)
    change = TunerChange("r2", "batch_size", 256, 192, "engine queue 40 for 2 rounds")
    control.on_tune([change])
    assert list(control.audit) == [
        Event(
            1,
            WALL,
            "tuner",
            "tune",
            {
                "replica": "r2",
                "setting": "batch_size",
                "old": 256,
                "new": 192,
                "signal": "engine queue 40 for 2 rounds",
            },
            True,
            "r2: batch_size 256 -> 192 (engine queue 40 for 2 rounds)",
        )
    ]


def test_a_real_tuning_round_is_audited_one_event_per_change_in_the_tuners_order() -> None:
    """The core tells the control surface (a listener) what ``tune()`` changed: nobody has to
    pass the returned list on."""
    core, clock = tuning_core()
    control = ControlSurface(core, wall_clock=lambda: WALL)
    seen: list[Event] = []
    control.subscribe(seen.append)
    changes = drive_a_tuner_change(core, clock)
    tuned = [e for e in control.audit if e.kind == "tune"]
    assert [(e.actor, e.ok, e.message) for e in tuned] == [
        ("tuner", True, c.message) for c in changes
    ]
    assert [e.args for e in tuned] == [
        {"replica": c.replica, "setting": c.setting, "old": c.old, "new": c.new, "signal": c.signal}
        for c in changes
    ]
    assert core.replica(changes[0].replica).batch_size == changes[0].new  # it did happen
    assert seen == list(control.audit)
    assert [e.seq for e in control.audit] == list(range(1, len(control.audit) + 1))


def test_a_round_that_changes_nothing_records_nothing() -> None:
    core, _ = tuning_core()
    control = ControlSurface(core)
    assert core.tune() == []
    assert not control.audit


def test_subscribers_see_events_in_sequence_order_even_one_recorded_by_a_subscriber() -> None:
    """Subscribers see events in sequence order even when one subscriber's reaction (here an
    operator command) records an event while the first is still being handed out."""
    core = RouterCore(make_fleet(), clock=ManualClock(), rng=random.Random(0))
    control = ControlSurface(core)
    first: list[int] = []
    second: list[int] = []

    def react(event: Event) -> None:
        first.append(event.seq)
        if event.kind == "tune":
            control.apply(SetWeight("r0", 3.0), actor="bot")

    control.subscribe(react)
    control.subscribe(lambda e: second.append(e.seq))
    control.on_tune([TunerChange("r1", "weight", 1.0, 1.5, "measured throughput")])
    assert first == second == [1, 2]
    assert [e.kind for e in control.audit] == ["tune", "weight"]


def test_a_failing_subscriber_is_logged_and_neither_stops_others_nor_the_tuner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, clock = tuning_core()
    control = ControlSurface(core)
    seen: list[Event] = []

    def broken(_: Event) -> None:
        raise RuntimeError("subscriber bug")

    control.subscribe(broken)
    control.subscribe(seen.append)
    with caplog.at_level(logging.ERROR, logger="router.control"):
        changes = drive_a_tuner_change(core, clock)  # core.tune() does not raise
    assert [e.message for e in seen] == [c.message for c in changes]
    assert "subscriber bug" in caplog.text
