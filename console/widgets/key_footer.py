"""The footer of keys: hides and shows its keys in place instead of rebuilding itself."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey  # not exported; Textual is pinned to 8.x

Key = tuple[str, str, str, bool, str]
"""What one footer key shows: key, action, description, enabled, tooltip."""


class KeyFooter(Footer):
    """Textual's footer, minus its rebuild on every focus change.

    Textual's footer removes and mounts all its keys whenever the screen's bindings may have
    changed. Focus moving into the filter box hides the printable keys (they type there) and
    moving out shows them again; each rebuild cost two relayouts of the whole screen, painted
    in frames after the one that showed the key's effect. When the keys wanted are ones the
    footer already has, this one only changes which are displayed.
    """

    def __init__(self, *, compact: bool = False) -> None:
        super().__init__(compact=compact)
        self._composed: tuple[Key, ...] = ()
        self._shown: tuple[Key, ...] = ()

    def on_mount(self) -> None:
        # Besides Footer's own subscription, which is queued behind this footer's messages:
        # keys shown or hidden as the bindings change (a focus change publishes them) reach
        # the screen in the same frame as the focus. A rebuild stays with the queued one.
        self.screen.bindings_updated_signal.subscribe(self, self._show_now, immediate=True)

    def _show_now(self, screen: Screen[Any]) -> None:
        self._shown_in_place(screen)

    def compose(self) -> ComposeResult:
        self._composed = self._shown = _shown_keys(self.screen)
        yield from super().compose()

    def bindings_changed(self, screen: Screen[Any]) -> None:
        if not self._shown_in_place(screen):
            super().bindings_changed(screen)

    def _shown_in_place(self, screen: Screen[Any]) -> bool:
        """Show the keys the screen's bindings want by hiding and showing the keys composed;
        False when that cannot do it (nothing composed yet, another screen, keys missing)."""
        if not self.children or screen is not self.screen:
            return False
        wanted = _shown_keys(screen)
        if wanted != self._shown:
            if not self._show_only(wanted):
                return False
            self._shown = wanted
        return True

    def _show_only(self, wanted: tuple[Key, ...]) -> bool:
        """Display just ``wanted`` among the keys composed; False if some are missing."""
        keys = [
            k
            for k in self.children
            if isinstance(k, FooterKey) and not k.has_class("-command-palette")
        ]
        wanted_set = set(wanted)
        if len(keys) != len(self._composed) or not wanted_set <= set(self._composed):
            return False
        if any((k.key, k.action) != c[:2] for k, c in zip(keys, self._composed, strict=True)):
            return False
        for key, composed in zip(keys, self._composed, strict=True):
            key.display = composed in wanted_set
        return True


def _shown_keys(screen: Screen[Any]) -> tuple[Key, ...]:
    """The keys the footer shows for the screen's bindings: one per action, first wins."""
    first: dict[str, Key] = {}
    for _node, binding, enabled, tooltip in screen.active_bindings.values():
        if binding.show and binding.action not in first:
            first[binding.action] = (
                binding.key,
                binding.action,
                binding.description,
                enabled,
                tooltip,
            )
    return tuple(first.values())
