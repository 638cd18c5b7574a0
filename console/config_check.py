"""``gpurouter config check FILE``: load a fleet file and say what is wrong with it, all at once."""

from __future__ import annotations

import argparse
from typing import TextIO

from router.config import load_fleet, unprofiled_kinds
from router.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a fleet file")
    check.add_argument("file", help="fleet YAML file")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return run_check(args.file, out, err)


def run_check(path: str, out: TextIO, err: TextIO) -> int:
    """Print a one-line summary (exit 0), or every problem in the file (exit 2).

    After the summary, a note names each replica kind with no performance profile: routing
    does not need one, so it is no problem, but the emulator and the simulator cannot run it.
    """
    try:
        fleet = load_fleet(path)
        unprofiled = unprofiled_kinds(fleet)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=err)
        print(f"{len(exc.problems)} problem(s) in {path}", file=err)
        return 2
    nodes, gpus, replicas = len(fleet.nodes), fleet.gpu_count, len(fleet.replicas)
    print(f"ok: {nodes} nodes, {gpus} GPUs, {replicas} replicas", file=out)
    for model, gpu in unprofiled:
        note = f"note: no performance profile for {model} on {gpu}"
        print(f"{note}; the emulator and simulator cannot model it", file=out)
    return 0
