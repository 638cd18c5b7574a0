"""The command palette: every registry action by name, per replica where it targets one.

Fed from :mod:`console.actions` like the keys and the help screen; a read-only console lists
only the watching actions. Strategies and themes are offered by name as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from console.actions import visible
from router.strategies import STRATEGIES
from themes import THEMES

Entry = tuple[str, str, Callable[[], object]]
"""(text, help, what it does)."""


class ConsoleCommands(Provider):
    def _entries(self, every_replica: bool) -> Iterator[Entry]:
        # Imported here: console.app imports this module to register the provider.
        from console.app import ConsoleApp

        if not isinstance(self.app, ConsoleApp):
            return
        app: ConsoleApp = self.app
        selected = app.selected_replica()
        replicas = app.replica_ids() if every_replica else ([selected] if selected else [])
        for a in visible(app.read_only, broker=app.backend.cluster is not None):
            if a.id == "palette":
                continue
            if a.target:
                for rid in replicas:
                    yield f"{a.title} {rid}", a.description, partial(app.perform, a.id, rid)
            else:
                yield a.title, a.description, partial(app.perform, a.id)
        if not app.read_only:
            for name, cls in STRATEGIES.items():
                yield f"Strategy {name}", cls.summary, partial(app.switch_strategy, name)
        for name in THEMES:
            yield f"Theme {name}", f"Switch to the {name} theme", partial(app.set_theme, name)

    async def discover(self) -> Hits:
        for text, help_text, run in self._entries(every_replica=False):
            yield DiscoveryHit(text, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_text, run in self._entries(every_replica=True):
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), run, text=text, help=help_text)
