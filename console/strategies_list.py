"""``gpurouter strategies``: the routing strategies by registry name, one line each."""

from __future__ import annotations

import argparse
from typing import TextIO

from router.strategies import STRATEGIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return print_strategies(out)


def print_strategies(out: TextIO) -> int:
    """Print a two-column table of strategy names and summaries, in registry order."""
    header = ("NAME", "SUMMARY")
    rows = [header, *((name, cls.summary) for name, cls in STRATEGIES.items())]
    width = max(len(name) for name, _ in rows)
    for name, summary in rows:
        print(f"{name:<{width}}  {summary}", file=out)
    return 0
