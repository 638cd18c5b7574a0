"""The footer shows the keys that act now, and changes them in place where it can.

Textual's footer rebuilds all its keys whenever bindings may have changed; moving focus into
the filter box and out again cost two relayouts each way. Ours hides and shows the keys it
already has, and rebuilds only for keys it does not have.
"""

from __future__ import annotations

from textual.widgets._footer import FooterKey

from console.app import ConsoleApp
from console.widgets.filter_input import FilterInput
from console.widgets.fleet_table import FleetTable
from console.widgets.key_footer import KeyFooter
from tests.console_helpers import loaded_rig

SIZE = (100, 30)
PRINTABLE = {"question_mark", "s", "w", "d", "p", "q"}
"""Keys the filter box takes as text while it has focus."""


def footer_keys(app: ConsoleApp) -> list[FooterKey]:
    return list(app.query_one(KeyFooter).query(FooterKey))


def shown(app: ConsoleApp) -> set[str]:
    return {k.key for k in footer_keys(app) if k.display}


async def test_filter_box_hides_the_keys_it_types_and_closing_shows_them_again() -> None:
    app = ConsoleApp(loaded_rig().backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        before = footer_keys(app)
        assert shown(app) >= PRINTABLE

        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.focused, FilterInput)
        assert not PRINTABLE & shown(app)
        assert "slash" in shown(app)

        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.focused, FleetTable)
        assert shown(app) >= PRINTABLE
        # The same widgets throughout: nothing was removed and mounted again.
        assert footer_keys(app) == before


async def test_keys_the_footer_lacks_rebuild_it() -> None:
    """Read-only greys the mutating keys: a state the footer never composed."""
    app = ConsoleApp(loaded_rig().backend, auto_refresh=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        drain = next(k for k in footer_keys(app) if k.key == "d")
        assert not drain.has_class("-disabled")

        app.read_only = True
        app.refresh_bindings()
        await pilot.pause()
        drain = next(k for k in footer_keys(app) if k.key == "d")
        assert drain.has_class("-disabled")
        assert drain.display
