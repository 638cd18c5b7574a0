"""SteadyStatic: a layout of the screen only when the text's shape changes."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult

from console.widgets.steady_static import SteadyStatic


class Holder(App[None]):
    CSS = "#auto { width: auto; }"

    def compose(self) -> ComposeResult:
        yield SteadyStatic(id="block")
        yield SteadyStatic(id="auto")


def layouts_asked(widget: SteadyStatic) -> list[bool]:
    """The ``layout`` argument of each refresh the widget asks for from now on."""
    asked: list[bool] = []
    refresh = widget.refresh

    def recording(*args: object, layout: bool = False, **kwargs: object) -> object:
        asked.append(layout)
        return refresh(*args, layout=layout, **kwargs)  # type: ignore[arg-type]

    widget.refresh = recording  # type: ignore[method-assign,assignment]
    return asked


async def test_new_lines_of_the_same_shape_are_repainted_without_a_layout() -> None:
    app = Holder()
    async with app.run_test(size=(40, 10)) as pilot:
        block = app.query_one("#block", SteadyStatic)
        asked = layouts_asked(block)
        block.put(Text("one\ntwo"))
        block.put(Text("uno\ndos, a longer line"))  # the width is the container's: same shape
        block.put(Text("a\nb\nc"))
        block.put(Text("x\ny\nz"))
        assert asked == [True, False, True, False]
        await pilot.pause()
        assert block.size.height == 3


async def test_a_width_set_by_the_content_lays_out_again_when_the_longest_line_changes() -> None:
    app = Holder()
    async with app.run_test(size=(40, 10)) as pilot:
        auto = app.query_one("#auto", SteadyStatic)
        asked = layouts_asked(auto)
        auto.put(Text("short"))
        auto.put(Text("other"))
        auto.put(Text("a good deal longer"))
        assert asked == [True, False, True]
        await pilot.pause()
        assert auto.size.width == len("a good deal longer")


async def test_a_line_wider_than_the_widget_is_cut_with_an_ellipsis_not_wrapped() -> None:
    app = Holder()
    async with app.run_test(size=(20, 10)) as pilot:
        block = app.query_one("#block", SteadyStatic)
        block.put(Text("a line far wider than twenty columns\nnext"))
        await pilot.pause()
        assert block.size.height == 2  # a wrapped line would make it 3 or more
        first = block.render_line(0).text.rstrip()
        assert first.endswith("…")
        assert len(first) == 20
