"""Screenshots of the console compared with the accepted ones in tests/__snapshots__/.

Deterministic by construction: the router runs on a manual clock with a fixed wall clock for
the audit trail, the refresh timer is off (the app draws once at mount) and no toast is up.
Regenerate after an intended change with ``pytest tests/test_console_snapshots.py
--snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from console.app import ConsoleApp
from router.control import Drain, SetWeight
from tests.console_helpers import loaded_rig, telemetry_for

Snap = Callable[..., bool]


def dashboard(theme: str = "dark") -> ConsoleApp:
    """A loaded fleet with fresh telemetry, one drained replica and a pinned weight."""
    rig = loaded_rig()
    status = telemetry_for(rig)
    rig.backend.telemetry = lambda: status
    rig.control.apply(SetWeight("r1", 2.5), actor="console")
    rig.control.apply(Drain("r3"), actor="console")
    return ConsoleApp(rig.backend, theme=theme, auto_refresh=False)


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
