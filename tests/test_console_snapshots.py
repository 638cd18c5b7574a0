"""Screenshots of the console compared with the accepted ones in tests/__snapshots__/.

Deterministic by construction: the router runs on a manual clock with a fixed wall clock for
the audit trail, the refresh timer is off (the app draws once at mount) and no toast is up.
Regenerate after an intended change with ``pytest tests/test_console_snapshots.py
--snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from textual.widgets import Input

from console.app import ConsoleApp
from router.config.schema import CommandUpdaterConfig, RolloutConfig, UpdaterConfig
from router.control import Drain, SetWeight
from router.request import Request
from router.rollout.manager import RolloutManager
from tests.console_helpers import loaded_rig, telemetry_for
from tests.fleet_factory import make_fleet

Snap = Callable[..., bool]


def dashboard(theme: str = "dark") -> ConsoleApp:
    """A loaded fleet with fresh telemetry, one drained replica and a pinned weight, served
    on the default addresses."""
    rig = loaded_rig()
    status = telemetry_for(rig)
    rig.backend.telemetry = lambda: status
    rig.backend.front_url = "http://127.0.0.1:8000"
    rig.backend.admin_url = "http://127.0.0.1:8001"
    rig.control.apply(SetWeight("r1", 2.5), actor="console")
    rig.control.apply(Drain("r3"), actor="console")
    return ConsoleApp(rig.backend, theme=theme, auto_refresh=False)


def nothing_behind() -> ConsoleApp:
    """`gpurouter console` before the replicas are started: every health check failed, and
    one node's agent said offline."""
    rig = loaded_rig(requests=0, completed=0)
    status = telemetry_for(rig, offline=frozenset({"node-0"}))
    rig.backend.telemetry = lambda: status
    rig.backend.failing = lambda: frozenset({"r0", "r1", "r2", "r3"})
    return ConsoleApp(rig.backend, auto_refresh=False)


@pytest.mark.parametrize("theme", ["dark", "light"])
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_dashboard(snap_compare: Snap, theme: str, size: tuple[int, int]) -> None:
    """Header, fleet table, GPU-model summary, events and footer at both sizes."""
    assert snap_compare(dashboard(theme), terminal_size=size)


def test_confirmation_shows_replica_and_impact(snap_compare: Snap) -> None:
    """Drain r0: in-flight count by priority and where its share of new work goes."""
    assert snap_compare(dashboard(), press=["d"], terminal_size=(80, 24))


def test_help_screen(snap_compare: Snap) -> None:
    """Every registry action with its key and description, and the legend."""
    assert snap_compare(dashboard(), press=["question_mark"], terminal_size=(80, 24))


def test_read_only_help_greys_mutating_actions(snap_compare: Snap) -> None:
    app = dashboard()
    app.read_only = True

    async def open_help(pilot: Any) -> None:
        await pilot.press("question_mark")

    assert snap_compare(app, run_before=open_help, terminal_size=(80, 24))


def test_filter_box_floats_above_the_footer(snap_compare: Snap) -> None:
    """The open filter box covers the panes' last rows, not the footer, and resizes nothing;
    the footer drops the keys that now type into the box."""
    assert snap_compare(dashboard(), press=["slash", "v", "1"], terminal_size=(80, 24))


def test_preempt_confirmation_says_what_stops_and_that_it_stays_drained(snap_compare: Snap) -> None:
    """Which requests are re-queued, which end with an error, which keep running, and that
    the replica stays drained afterwards."""
    assert snap_compare(dashboard(), press=["p"], terminal_size=(80, 24))


def test_strategy_picker_marks_cursor_and_current_without_colour(snap_compare: Snap) -> None:
    """▶ on the cursor's option, (current) on the running strategy; summaries wrap under
    themselves."""
    assert snap_compare(dashboard(), press=["s", "up"], terminal_size=(80, 24))


def test_the_replica_column_stays_when_the_table_scrolls_right(snap_compare: Snap) -> None:
    assert snap_compare(dashboard(), press=["right"] * 40, terminal_size=(80, 24))


def test_paused_at_80_columns_says_so_in_the_header(snap_compare: Snap) -> None:
    assert snap_compare(dashboard(), press=["space"], terminal_size=(80, 24))


def test_a_console_with_nothing_behind_the_endpoints(snap_compare: Snap) -> None:
    """Rows failing, the header's imbalance "no replica up", the GPU-models pane none up."""
    assert snap_compare(nothing_behind(), terminal_size=(80, 24))


def rolling_dashboard() -> ConsoleApp:
    """A loaded fleet, every replica in service, whose fleet file names an update command."""
    updater = UpdaterConfig(command=CommandUpdaterConfig(run="systemctl restart vllm@{replica}"))
    fleet = replace(make_fleet(batch_sizes=[4, 4, 2, 2]), rollout=RolloutConfig(updater=updater))
    rig = loaded_rig(fleet)
    rig.backend.rollouts = RolloutManager(rig.core, rig.control)
    return ConsoleApp(rig.backend, auto_refresh=False)


def test_rollout_confirmation_shows_the_waves_before_anything_starts(snap_compare: Snap) -> None:
    """Each wave's replicas with their capacity share and what stays in service, the settings
    in force and the updater; why there is no prediction (the test model has no profile),
    Cancel focused."""

    async def ask_for_the_plan(pilot: Any) -> None:
        await pilot.press("v")
        await pilot.pause()
        form = pilot.app.screen
        form.query_one("#rollout-version", Input).value = "llama-3.1-8b-v2"
        form.query_one("#rollout-floor", Input).value = "0.5"
        await pilot.press("enter")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(rolling_dashboard(), run_before=ask_for_the_plan, terminal_size=(80, 24))


CANARY = "test-model-v2"


def canary_console() -> ConsoleApp:
    """An idle fleet whose r0 already runs the new version, with the router's splits: a
    canary there needs no updater."""
    rig = loaded_rig(requests=0, completed=0)
    rig.core.rng = random.Random(7)
    rig.core.replica("r0").served_models = (CANARY, "test-model")
    rig.backend.rollouts = RolloutManager(rig.core, rig.control)
    return ConsoleApp(rig.backend, auto_refresh=False)


async def canary_at_half(pilot: Any) -> None:
    """A manual canary on r0 set to 50% through the console's keys, then 24 requests of
    the model, each answered (first byte 40 ms on the new version, 30 ms on the old)."""
    backend = pilot.app.backend
    splits = backend.rollouts.splits
    canary = splits.start_canary({"version": CANARY, "replicas": ["r0"], "manual": True}, "console")
    canary.id = "canary-1"  # ids count the process's canaries: the same name whatever ran first
    await pilot.pause()
    await pilot.press("g", "s")
    await pilot.pause()
    pilot.app.screen.query_one(Input).value = "50"
    await pilot.press("enter")
    await pilot.pause()
    await pilot.press("y")
    await pilot.app.workers.wait_for_complete()
    core, clock = backend.core, backend.core.clock
    for i in range(24):
        core.submit(Request(f"c{i:02d}", 200, 64, clock(), model="test-model"))
        a = core.running[f"c{i:02d}"]
        clock.advance(0.04 if a.replica.version == CANARY else 0.03)
        core.first_byte(a)
        clock.advance(0.5)
        core.complete(a)
    pilot.app.refresh_data()
    pilot.app.clear_notifications()  # the step's toast: its timeout is the wall clock's
    await pilot.pause()


def test_a_canarys_split_screen_shows_its_share_schedule_and_both_versions(
    snap_compare: Snap,
) -> None:
    """The share now, who set it, the judge's figures for the new and the old version over
    its window, and the keys that steer it in the border."""
    assert snap_compare(canary_console(), run_before=canary_at_half, terminal_size=(80, 24))
