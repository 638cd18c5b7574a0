"""``gpurouter config check FILE``: load a fleet file and say what is wrong with it, all at once."""

from __future__ import annotations

from typing import TextIO

from router.config import load_fleet
from router.errors import ConfigError


def run_check(path: str, out: TextIO, err: TextIO) -> int:
    """Print a one-line summary (exit 0), or every problem in the file (exit 2)."""
    try:
        fleet = load_fleet(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=err)
        print(f"{len(exc.problems)} problem(s) in {path}", file=err)
        return 2
    nodes, gpus, replicas = len(fleet.nodes), fleet.gpu_count, len(fleet.replicas)
    print(f"ok: {nodes} nodes, {gpus} GPUs, {replicas} replicas", file=out)
    return 0
