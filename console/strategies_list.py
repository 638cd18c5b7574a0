"""``gpurouter strategies``: the routing strategies by registry name, one line each."""

from __future__ import annotations

from typing import TextIO

from router.strategies import STRATEGIES


def print_strategies(out: TextIO) -> int:
    """Print a two-column table of strategy names and summaries, in registry order."""
    header = ("NAME", "SUMMARY")
    rows = [header, *((name, cls.summary) for name, cls in STRATEGIES.items())]
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}", file=out)
    return 0
