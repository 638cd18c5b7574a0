"""A replica in detail: its facts, its learned capacity, latency and throughput history, and
the recent decisions that chose it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.signal import Signal
from textual.widgets import Sparkline

from console.view.capacity import capacity_lines
from console.view.detail import decision_lines, facts
from console.view.format import Cell
from console.view.history import ReplicaHistory
from console.widgets.key_footer import KeyFooter
from console.widgets.steady_static import SteadyStatic
from console.widgets.tones import Styles, to_text
from router.snapshot import ReplicaSnapshot
from router.strategies import Explanation


@dataclass(frozen=True, slots=True)
class DetailData:
    replica: ReplicaSnapshot | None
    history: ReplicaHistory | None
    decisions: list[Explanation] | None
    """None: not fetched yet."""
    now: float


def _lines(lines: list[tuple[Cell, ...]] | tuple[tuple[Cell, ...], ...], styles: Styles) -> Text:
    text = to_text((), styles)
    for i, line in enumerate(lines):
        if i:
            text.append("\n")
        text.append_text(to_text(line, styles))
    return text


FETCH_CHECK_S = 0.1
"""While the decisions are being fetched (an attached console), how often the detail looks
again: they show as soon as the poll it asked for lands, not at the next refresh."""

TTFT_LABEL = "TTFT p50 (last 2 min)"
THRU_LABEL = "Throughput, req/s"


class ReplicaDetail(Screen[None]):
    """One replica in detail, redrawn at each refresh while it is on screen.

    Built once and kept by the app: :meth:`show` points it at another replica, and each
    open draws every part afresh (what a new screen would show), so an open costs no
    compose, no styling of new widgets and no rebuilt footer."""

    DEFAULT_CSS = """
    ReplicaDetail #capacity {
        height: auto;
        padding: 0 1;
        border: round $secondary 40%;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.pop_screen", "Back", show=False),
    ]

    def __init__(
        self,
        replica: str,
        data: Callable[[], DetailData],
        styles: Styles,
        refreshed: Signal[Any] | None = None,
    ) -> None:
        super().__init__()
        self.replica = replica
        self.refreshed = refreshed
        self.data = data
        self.tones = styles
        self._looking_again = False

    def compose(self) -> ComposeResult:
        yield SteadyStatic(id="facts")
        yield SteadyStatic(id="capacity")
        yield SteadyStatic(TTFT_LABEL, classes="chart-label", id="ttft-label")
        yield Sparkline([], id="ttft")
        yield SteadyStatic(THRU_LABEL, classes="chart-label", id="thru-label")
        yield Sparkline([], id="thru")
        with VerticalScroll(id="decisions"):
            yield SteadyStatic(id="decision-lines")
        # Textual's footer rebuilds all its keys each time the screen comes back; this one
        # keeps them while the bindings are the same.
        yield KeyFooter()

    def on_mount(self) -> None:
        if not self.children:
            return  # composed while the app was closing: Textual mounted nothing
        self.query_one("#decisions").border_title = "Recent decisions that chose it"
        self.query_one("#capacity").border_title = "Capacity"
        if self.refreshed is not None:
            self.refreshed.subscribe(self, lambda _: self._refreshed())

    def on_screen_resume(self) -> None:
        # Each open, and each return from a dialog over it, shows the data of now.
        self.redraw()

    def show(self, replica: str, data: Callable[[], DetailData]) -> None:
        """Show ``replica`` from ``data`` when next opened, scrolled back to the top."""
        self.replica, self.data = replica, data
        if self.is_mounted:
            self.query_one("#decisions", VerticalScroll).scroll_home(animate=False)

    def _refreshed(self) -> None:
        # Kept while closed: only a screen in the stack (on top, or under a dialog) is drawn.
        if self in self.app.screen_stack:
            self.redraw()

    def redraw(self) -> None:
        """Every part from the data of now: a kept screen shows nothing of its last open."""
        d = self.data()
        if d.replica is None:
            self._put("#facts", Text(f"{self.replica}: no such replica"))
            self._put("#capacity", Text())
            self._charts(None)
            self._put("#decision-lines", Text())
            return
        self._put("#facts", _lines(facts(d.replica), self.tones))
        self._put("#capacity", _lines(capacity_lines(d.replica), self.tones))
        self._charts(d.history)
        lines = decision_lines(d.decisions, self.replica, d.now)
        self._put("#decision-lines", _lines(lines, self.tones))
        if d.decisions is None and not self._looking_again:
            self._looking_again = True
            self.set_timer(FETCH_CHECK_S, self._look_again)

    def _look_again(self) -> None:
        self._looking_again = False
        if self in self.app.screen_stack:  # closed meanwhile: its next open draws afresh
            self.redraw()

    def _put(self, selector: str, text: Text) -> None:
        self.query_one(selector, SteadyStatic).put(text)

    def _charts(self, history: ReplicaHistory | None) -> None:
        """The sparklines and their labels; as composed when there is no history."""
        ttft = list(history.ttft_p50) if history is not None else []
        thru = list(history.throughput) if history is not None else []
        self.query_one("#ttft", Sparkline).data = ttft
        self.query_one("#thru", Sparkline).data = thru
        if history is None:
            self._put("#ttft-label", Text(TTFT_LABEL))
            self._put("#thru-label", Text(THRU_LABEL))
            return
        p50 = f"now {ttft[-1] * 1000:.0f}ms, max {max(ttft) * 1000:.0f}ms" if ttft else "no data"
        self._put("#ttft-label", Text(f"{TTFT_LABEL}: {p50}"))
        t = f"now {thru[-1]:.1f}, max {max(thru):.1f}" if thru else "no data"
        self._put("#thru-label", Text(f"{THRU_LABEL}: {t}"))

    def restyle(self, styles: Styles) -> None:
        self.tones = styles
        self.redraw()
