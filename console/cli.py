"""The ``gpurouter`` command line. Heavy imports happen inside each subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpurouter",
        description="Route LLM inference across heterogeneous GPU fleets.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="work with fleet files")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser("check", help="validate a fleet file")
    check.add_argument("file", help="fleet YAML file")

    sub.add_parser("strategies", help="list the routing strategies")

    from console import sim_command

    sim_command.add_arguments(sub.add_parser("sim", help="compare strategies on the simulator"))

    from console import emulate_command

    emulate_command.add_arguments(
        sub.add_parser("emulate", help="serve a fleet's replicas as emulated vLLM servers")
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "config":
        from console.config_check import run_check

        return run_check(args.file, sys.stdout, sys.stderr)
    if args.command == "sim":
        from console.sim_command import run

        return run(args, sys.stdout)
    if args.command == "emulate":
        from console.emulate_command import run as run_emulate

        return run_emulate(args, sys.stdout, sys.stderr)
    if args.command == "strategies":
        from console.strategies_list import print_strategies

        return print_strategies(sys.stdout)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
