"""``gpurouter sim``'s table: best first, the best marked, fitted to the terminal.

Below :data:`NARROW_BELOW` columns the table keeps the figures that decide (share of capacity
served, TTFT, imbalance) and leaves the rest to ``--json``. Under the table, a line says what
the rows are ranked by, and one line per group of identical rows says why they are identical.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from router.sim.compare import best, identical_groups, rank, ranked_by, why_identical

__all__ = ["NARROW_BELOW", "print_table", "terminal_width"]

NARROW_BELOW = 100
"""Narrower terminals get the narrow layout (an 80-column one fits it)."""
_UNSIZED = 120
"""The width when ``out`` is not a terminal and $COLUMNS does not say."""
BEST = "★"

Row = Mapping[str, Any]
Column = tuple[str, Callable[[Row], object]]
"""(heading, the cell's value from a row)."""


def terminal_width(out: TextIO) -> int:
    """The terminal's columns; else $COLUMNS; else :data:`_UNSIZED` (a file has no width)."""
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):  # a stream with no descriptor (StringIO)
        pass
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else _UNSIZED


def print_table(rows: Sequence[Row], sustainable: bool, out: TextIO, width: int) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    narrow = width < NARROW_BELOW
    columns = _columns(rows, sustainable, narrow)
    table = Table(title=_title(rows, sustainable), title_justify="left", box=box.SIMPLE_HEAD)
    for i, (heading, _) in enumerate(columns):
        table.add_column(heading, justify="left" if i == 0 else "right", no_wrap=i == 0)
    winners = best(rows, sustainable)
    for row in rank(rows, sustainable):
        mark = BEST if row["strategy"] in winners else " "
        table.add_row(f"{mark} {row['strategy']}", *(_cell(get(row)) for _, get in columns[1:]))
    console = Console(file=out, width=width, highlight=False)
    console.print(table)
    for note in _notes(rows, sustainable, narrow):
        console.print(Text(note))


def _title(rows: Sequence[Row], sustainable: bool) -> str:
    first = rows[0]
    capacity = f"capacity_rps = {first['capacity_rps']:.2f}"
    if sustainable:
        return f"{capacity}; highest rate with p99 TTFT under {first['slo_ttft_p99_s']:g} s"
    offered = first["offered_rps"]
    return f"{capacity}; offered {offered:.2f} req/s, {offered / first['capacity_rps']:.2f} of it"


def _columns(rows: Sequence[Row], sustainable: bool, narrow: bool) -> list[Column]:
    if sustainable:
        return _sustainable_columns(narrow)
    columns: list[Column] = [("strategy", lambda r: r["strategy"])]
    if not narrow:
        columns.append(("served\nreq/s", lambda r: r["throughput_rps"]))
    columns += [
        ("of\ncapacity", lambda r: r["capacity_fraction"]),
        ("TTFT p50\ns", lambda r: r["ttft_p50_s"]),
        ("TTFT p99\ns", lambda r: r["ttft_p99_s"]),
    ]
    if not narrow:
        columns.append(("e2e p99\ns", lambda r: r["e2e_p99_s"]))
    columns.append(("imbalance", lambda r: r["imbalance_factor"]))
    if any(r["lost_requests"] for r in rows):
        columns.append(("lost", lambda r: r["lost_requests"]))
    return columns


def _sustainable_columns(narrow: bool) -> list[Column]:
    def at_max(field: str) -> Callable[[Row], object]:
        return lambda r: "—" if r["at_max"] is None else r["at_max"][field]

    columns: list[Column] = [
        ("strategy", lambda r: r["strategy"]),
        ("max\nreq/s", lambda r: r["max_sustainable_rps"]),
        ("of\ncapacity", lambda r: r["max_sustainable_fraction"]),
        ("TTFT p99\nat max, s", at_max("ttft_p99_s")),
    ]
    if not narrow:
        columns.append(("imbalance\nat max", at_max("imbalance_factor")))
    return columns


def _notes(rows: Sequence[Row], sustainable: bool, narrow: bool) -> list[str]:
    field = ranked_by(sustainable)
    order = "highest (then the lowest p99 TTFT)" if sustainable else "lowest (then the most served)"
    notes = [f"{BEST} best; rows ranked by {field}, {order} first"]
    for names in identical_groups(rows, sustainable):
        notes.append(f"{' and '.join(names)} ran identically: {why_identical(names)}")
    if narrow:
        notes.append("every figure: --json, or a terminal 100 columns wide")
    return notes


def _cell(value: object) -> str:
    if value is None:
        return "unbounded"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
