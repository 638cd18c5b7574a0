"""A router with real work in it, for the console's tests: requests in flight at every
priority (some already streaming), some completed, a queue, on a manual clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.widgets import Static

from console.backend import ConsoleBackend
from console.screens.replica_detail import ReplicaDetail
from console.view.fleet import COLUMNS
from console.widgets.fleet_table import PAD, FleetTable
from router import ControlSurface, ManualClock, Priority, Request, RouterCore
from router.config.schema import ConsoleConfig, FleetConfig
from router.control import Event
from router.replica import Telemetry
from router.telemetry.schema import GpuSample
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus
from tests.fleet_factory import make_fleet

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from console.app import ConsoleApp

WALL = 1_700_000_000.0
"""A fixed wall clock for the audit trail: screenshots show the same times every run."""


def last_command(control: ControlSurface) -> Event:
    """The newest event an operator's command made: the router's own changes that the
    command caused (a replica's state) follow it in the trail."""
    return next(e for e in reversed(control.audit) if e.actor != "router")


@dataclass
class Rig:
    clock: ManualClock
    core: RouterCore
    control: ControlSurface
    backend: ConsoleBackend


def loaded_rig(
    fleet: FleetConfig | None = None,
    *,
    requests: int = 20,
    completed: int = 4,
) -> Rig:
    """Batch sizes 4,4,2,2: 12 slots, so ``requests`` beyond that wait in the queue."""
    clock = ManualClock(1000.0)
    core = RouterCore(fleet or make_fleet(batch_sizes=[4, 4, 2, 2]), clock=clock)
    control = ControlSurface(core, wall_clock=lambda: WALL)
    for i in range(requests):
        core.submit(Request(f"q{i:02d}", 200, 64, clock(), priority=Priority(i % 3)))
        clock.advance(0.01)
    clock.advance(0.2)
    for n, a in enumerate(list(core.running.values())):
        core.first_byte(a)
        clock.advance(0.03)
        if n < completed:
            core.complete(a)
    return Rig(clock, core, control, ConsoleBackend(core, control))


def with_keys(fleet: FleetConfig, keys: dict[str, str]) -> FleetConfig:
    from dataclasses import replace

    return replace(fleet, console=ConsoleConfig(keys=keys))


def telemetry_for(
    rig: Rig, *, stale: frozenset[str] = frozenset(), offline: frozenset[str] = frozenset()
) -> TelemetryStatus:
    """A connected feed with a reading of every GPU of node-0, stamping each replica's
    telemetry as the subscriber does (old by 10 s when the node is ``stale``)."""
    now = rig.clock()
    gpus = []
    for r in rig.core.pool:
        util = 0.35 + 0.15 * r.index
        r.telemetry = Telemetry(util, now - (10.0 if "node-0" in stale else 0.4))
        gpus.append(
            GpuSample(
                index=r.config.gpus[0],
                gpu_util_pct=util * 100,
                fb_used_mib=30_000 + 4000 * r.index,
                fb_total_mib=81_920,
                power_w=220.0 + 20 * r.index,
                power_limit_w=400.0,
                temp_c=55 + 8 * r.index,
                replica=r.id,
            )
        )
    feed = NodeFeed(
        node="node-0",
        online="node-0" not in offline,
        age_s=10.0 if "node-0" in stale else 0.4,
        stale="node-0" in stale,
        session=1,
        restarts=0,
        samples=50,
        lost_samples=2,
        dropped=1,
        gpus=tuple(gpus),
    )
    return TelemetryStatus(BrokerState.CONNECTED, "mqtt://127.0.0.1:1883", (feed,))


def column_span(column_id: str) -> tuple[int, int]:
    """Where a column's text sits on a table line: after its padding, as wide as the column."""
    x = 0
    for column in COLUMNS:
        if column.id == column_id:
            return x + PAD, x + PAD + column.width
        x += column.width + 2 * PAD
    raise KeyError(column_id)


def drawn_lines(table: FleetTable) -> list[str]:
    """The table's body lines as it draws them, scrolled to the top and to the left."""
    assert table.scroll_offset == (0, 0)
    first = table.header_height
    return [table.render_line(y).text for y in range(first, first + len(table.rows_shown))]


def drawn_cell(line: str, column_id: str) -> str:
    start, end = column_span(column_id)
    return line[start:end].rstrip()


def drawn_keys(table: FleetTable) -> list[str]:
    """Each drawn line's row, read from the line itself: ``node:NAME`` for a node heading
    (``▾ NAME`` in the replica column), ``NODE/INDEX`` for a GPU (its node and GPU columns)."""
    keys = []
    for line in drawn_lines(table):
        replica = drawn_cell(line, "replica")
        if replica.startswith("▾ "):
            keys.append("node:" + replica[2:])
        else:
            keys.append(f"{drawn_cell(line, 'node')}/{drawn_cell(line, 'gpu').split()[0]}")
    return keys


def drawn_text(table: FleetTable, key: str, column_id: str) -> str:
    """One cell of the row ``key`` as drawn."""
    return drawn_cell(drawn_lines(table)[drawn_keys(table).index(key)], column_id)


async def detail_facts(app: ConsoleApp, pilot: Pilot[None], replica: str) -> str:
    """Select ``replica``'s first row on the dashboard, open its detail with ``i``, and return
    the facts block as drawn."""
    table = app.query_one(FleetTable)
    table.select_row(next(i for i, r in enumerate(table.rows_shown) if r.replica == replica))
    await pilot.press("i")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ReplicaDetail)
    assert screen.replica == replica
    return str(screen.query_one("#facts", Static).render())
