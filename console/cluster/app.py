"""``gpurouter console --broker URL`` without ``--attach``: the cluster screen, read-only.

There is no router to ask: what the broker carries is what the routers and nodes publish,
and a command sent from here would be a desired-state message that only a router's admin
API (or ``gpurouter ctl``, with the cluster's control secret) should write. So every
command key says so and sends nothing.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType

from console.actions import ACTIONS, BY_ID
from console.cluster.screen import ClusterScreen
from console.cluster.watch import ClusterWatch
from router.errors import GpuRouterError
from themes import DEFAULT, THEMES

__all__ = ["BROKER_ONLY", "ClusterApp"]

BROKER_ONLY = (
    "read-only: watching the cluster through its broker; steer a router with "
    "--attach URL (its admin API) or gpurouter ctl"
)
HINT = "q quits · read-only: commands go to a router's admin API (--attach URL)"


class ClusterApp(App[None]):
    TITLE = "gpurouter cluster"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        # The keys an operator's fingers know still answer, each saying why nothing is sent.
        *(Binding(a.key, f"refuse('{a.id}')", a.title, show=False) for a in ACTIONS if a.mutates),
    ]

    def __init__(
        self,
        cluster: ClusterWatch,
        *,
        refresh_s: float = 1.0,
        theme: str | None = None,
        live: bool = True,
    ) -> None:
        chosen = theme or DEFAULT
        if chosen not in THEMES:
            raise GpuRouterError(f"no theme {chosen!r}; known: {', '.join(THEMES)}")
        super().__init__()
        for t in THEMES.values():
            self.register_theme(t)
        self.theme = chosen
        self.cluster = cluster
        self.refresh_s = refresh_s
        self.live = live

    def on_mount(self) -> None:
        self.push_screen(
            ClusterScreen(self.cluster, refresh_s=self.refresh_s, hint=HINT, live=self.live)
        )

    def action_refuse(self, action_id: str) -> None:
        title = BY_ID[action_id].title.lower()
        self.notify(f"{BROKER_ONLY}: {title} refused", severity="warning", title="refused")
