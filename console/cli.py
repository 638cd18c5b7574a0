"""The ``gpurouter`` command line.

Each subcommand lives in its own module of ``console/`` with two functions:
``add_arguments(parser)`` and ``run(args, out, err) -> int`` (the exit code). The modules keep
their heavy imports inside ``run`` so that ``gpurouter --help`` and the quick commands stay
quick. Add a command by adding a line to ``COMMANDS``.

Ctrl+C never ends in a traceback: a command with a partial report prints it and exits 130;
any other says it was interrupted and exits 130 (``console/interrupts.py``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, TextIO, cast

from console.interrupts import interrupted, silence

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module in console/, one-line help)
    "config": ("config_check", "work with fleet files (config check FILE)"),
    "strategies": ("strategies_list", "list the routing strategies"),
    "sim": ("sim_command", "compare strategies on the fleet simulator"),
    "run": ("run_command", "run a scenario file (simulated or live) and judge its checks"),
    "emulate": ("emulate_command", "serve a fleet's replicas as emulated vLLM servers"),
    "lab": ("lab_command", "real engines (vLLM for CPU) on this machine: up, down, status"),
    "console": (
        "console_command",
        "live dashboard and controls: the router in-process, or --attach to a running one",
    ),
    "serve": ("serve_command", "run the router headless: OpenAI front door and admin API"),
    "agent": ("agent_command", "publish this node's GPUs over MQTT (NVML or emulated)"),
    "broker": ("broker_command", "run the embedded MQTT broker (amqtt) on loopback"),
    "ctl": ("ctl_command", "talk to a running router's admin API"),
    "demo": ("demo_command", "a live emulated fleet routed end to end, with its console"),
}


class _Command(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, out: TextIO, err: TextIO) -> int: ...


def _module(name: str) -> _Command:
    return cast(_Command, importlib.import_module(f"console.{COMMANDS[name][0]}"))


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpurouter",
        description="Route LLM inference across heterogeneous GPU fleets.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        _module(name).add_arguments(sub.add_parser(name, help=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    prog = "gpurouter"
    try:
        args = _build_parser().parse_args(argv)
        prog = f"gpurouter {args.command}"
        return _module(args.command).run(args, sys.stdout, sys.stderr)
    except KeyboardInterrupt:
        # A command with a partial report catches Ctrl+C itself; any other stops where it was.
        return interrupted(prog, sys.stderr)
    except BrokenPipeError:
        # The reader went away (`| head -n 1`): stop quietly, as Unix tools do.
        silence(sys.stdout)
        return 0


if __name__ == "__main__":
    sys.exit(main())
