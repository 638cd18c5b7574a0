"""The asyncio driver's timers: the tuner timer's changes reach the audit trail, and a timer
whose step raises is counted, logged and keeps running."""

from __future__ import annotations

import logging

import pytest

from router.adaptive import TunerChange
from router.control import ControlSurface
from router.core import CoreListener
from router.http.driver import AsyncRouter
from tests.mqtt_fixtures import until
from tests.tuner_changes import saturate, tuning_core


class FailsOnce(CoreListener):
    """A listener with a bug: its first ``on_tune`` raises (out of ``core.tune()``)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_tune(self, changes: list[TunerChange]) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("listener bug")


async def test_the_tune_timer_records_the_tuners_changes_in_the_audit_trail() -> None:
    core, clock = tuning_core()
    control = ControlSurface(core)
    driver = AsyncRouter(core)
    saturate(core, clock)
    driver.start()
    try:
        await until(lambda: any(e.kind == "tune" for e in control.audit), what="a tune event")
    finally:
        await driver.stop()
    event = next(e for e in control.audit if e.kind == "tune")
    assert event.actor == "tuner"
    assert core.replica(event.args["replica"]).batch_size >= event.args["new"]


async def test_a_tuner_round_that_raises_is_logged_and_the_timer_keeps_tuning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, clock = tuning_core()
    bug = FailsOnce()
    core.listeners.append(bug)
    control = ControlSurface(core)
    driver = AsyncRouter(core)
    saturate(core, clock)
    with caplog.at_level(logging.ERROR, logger="router.http.driver"):
        driver.start()
        try:
            await until(lambda: bug.calls >= 2, what="a tuner round after the failing one")
        finally:
            await driver.stop()  # the failure did not end the task: stop() does not re-raise
    assert driver.timer_failures["tune"] == 1
    assert "router tune timer: step failed (1 so far)" in caplog.text
    assert "listener bug" in caplog.text
    assert any(e.kind == "tune" for e in control.audit)  # rounds after the failure recorded
