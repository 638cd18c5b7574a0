"""The cluster screen: every router and every node of the cluster, as its broker tells.

Three tables (routers, nodes, the routers' latest events) under a line of totals (broker
connection, routers and nodes heard, payloads dropped by reason), redrawn at the console's
refresh interval. Pushed over the dashboard of
an attached console (``c``; Esc closes it), or the whole of ``gpurouter console --broker``.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Static

from console.cluster.view import (
    EVENT_COLUMNS,
    NODE_COLUMNS,
    ROUTER_COLUMNS,
    event_rows,
    node_rows,
    router_rows,
    summary,
)
from console.cluster.watch import ClusterWatch

__all__ = ["ClusterScreen"]


class ClusterScreen(Screen[None]):
    DEFAULT_CSS = """
    ClusterScreen DataTable { height: auto; max-height: 33%; }
    ClusterScreen .title { text-style: bold; margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", show=False),
        Binding("c", "close", "Close", show=False),
    ]

    def __init__(
        self, cluster: ClusterWatch, *, refresh_s: float, hint: str, live: bool = True
    ) -> None:
        super().__init__()
        self.cluster = cluster
        self.refresh_s = refresh_s
        self.hint = hint
        """The last line: how to leave, and why nothing here steers the cluster."""
        self.live = live
        self.summary_shown = ""
        self.routers_shown: list[tuple[str, ...]] = []
        self.nodes_shown: list[tuple[str, ...]] = []
        self.events_shown: list[tuple[str, ...]] = []

    def compose(self) -> ComposeResult:
        yield Static(id="cluster-summary")
        yield Static(f"Routers of cluster {self.cluster.cluster}", classes="title")
        yield DataTable(id="routers", cursor_type="row", zebra_stripes=True)
        yield Static("Nodes", classes="title")
        yield DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        yield Static("Events of the routers", classes="title")
        yield DataTable(id="events", cursor_type="row", zebra_stripes=True)
        yield Static(self.hint, id="cluster-hint")

    def on_mount(self) -> None:
        self.query_one("#routers", DataTable).add_columns(*ROUTER_COLUMNS)
        self.query_one("#nodes", DataTable).add_columns(*NODE_COLUMNS)
        self.query_one("#events", DataTable).add_columns(*EVENT_COLUMNS)
        self.refresh_view()
        if self.live:
            self.set_interval(self.refresh_s, self.refresh_view, name="cluster-refresh")

    def refresh_view(self) -> None:
        """Read both feeds now and redraw; what was drawn stays readable for tests."""
        nodes, routers = self.cluster.telemetry(), self.cluster.routers()
        self.summary_shown = summary(nodes, routers)
        self.routers_shown, self.nodes_shown = router_rows(routers), node_rows(nodes)
        self.events_shown = event_rows(routers)
        self.query_one("#cluster-summary", Static).update(self.summary_shown)
        tables = {"#routers": self.routers_shown, "#nodes": self.nodes_shown}
        tables["#events"] = self.events_shown
        for table_id, rows in tables.items():
            table = self.query_one(table_id, DataTable)
            table.clear()
            table.add_rows(rows)

    def action_close(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
