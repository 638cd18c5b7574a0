"""``gpurouter config check FILE``: load a fleet file (or a scenario) and say what is wrong with
it, all at once."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TextIO

from router.config import load_fleet, unprofiled_kinds
from router.config.schema import FleetConfig
from router.errors import ConfigError
from router.yaml_lines import read_yaml

_SCENARIO_ONLY = ("fleet", "workload", "actions", "checks")
"""Top-level keys of a scenario file that no fleet file has."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a fleet file (or a scenario file)")
    check.add_argument("file", help="fleet YAML file, or a scenario file for gpurouter run")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return run_check(args.file, out, err)


def run_check(path: str, out: TextIO, err: TextIO) -> int:
    """Print a one-line summary (exit 0), or every problem in the file (exit 2).

    After the summary, a note names each replica kind with no performance profile: routing
    does not need one, so it is no problem, but the emulator and the simulator cannot run it.
    A scenario file is recognised as one and checked as such, with the fleet file it names.
    """
    try:
        if is_scenario(path):
            print(f"{path} is a scenario file (gpurouter run); checking it as one", file=out)
            return _check_scenario(path, out)
        fleet = load_fleet(path)
        unprofiled = unprofiled_kinds(fleet)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=err)
        print(f"{len(exc.problems)} problem(s) in {path}", file=err)
        return 2
    print(f"ok: {_fleet_summary(fleet)}", file=out)
    for model, gpu in unprofiled:
        note = f"note: no performance profile for {model} on {gpu}"
        print(f"{note}; the emulator and simulator cannot model it", file=out)
    return 0


def is_scenario(path: str) -> bool:
    """A mapping with no ``nodes`` and a key only scenarios have (a file that cannot be read
    is left to the fleet loader, which says why)."""
    try:
        document = read_yaml(path)
    except ConfigError:
        return False
    return (
        isinstance(document, Mapping)
        and "nodes" not in document
        and any(key in document for key in _SCENARIO_ONLY)
    )


def _check_scenario(path: str, out: TextIO) -> int:
    from router.scenario import load_scenario

    scenario = load_scenario(path)
    fleet = scenario.fleet
    print(
        f"ok: scenario {scenario.name}: {scenario.duration_s:g} s in {len(scenario.phases)} "
        f"phase(s), {len(scenario.actions)} action(s), {len(scenario.checks)} check(s); "
        f"fleet {fleet.file}: {_fleet_summary(fleet.config)}",
        file=out,
    )
    return 0


def _fleet_summary(fleet: FleetConfig) -> str:
    nodes, gpus, replicas = len(fleet.nodes), fleet.gpu_count, len(fleet.replicas)
    return f"{nodes} nodes, {gpus} GPUs, {replicas} replicas"
