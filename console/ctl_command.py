"""``gpurouter ctl``: talk to a running router's admin API from a shell or a script.

One subcommand per control command (the names of ``router.control.COMMANDS``), plus
``status``, ``events`` and ``decisions`` to read, and ``rollout`` (console/ctl/rollout.py)
to start and steer model rollouts. Every failure is one line on stderr and an
exit code from :data:`EXIT_CODES`; the parts live in ``console/ctl/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from console.interrupts import EXIT_INTERRUPTED, silence

if TYPE_CHECKING:
    from console.ctl.client import AdminClient

DEFAULT_ADMIN = "http://127.0.0.1:8001"
ADMIN_ENV = "GPUROUTER_ADMIN"
TOKEN_ENV = "GPUROUTER_ADMIN_TOKEN"  # console/ctl/client.py reads it; named here for --help
PROG = "gpurouter ctl"

EXIT_CODES = """\
exit codes:
  0  ok (and the end of `events --follow` by Ctrl+C or --count)
  1  the router refused the command (HTTP 409); its message is printed
  2  usage error or bad value (also HTTP 400: the router could not read the command)
  3  cannot reach the router: connection refused, timeout, the stream ended, or the
     address answered something that is not a gpurouter admin API
  4  authentication: no token where one is needed (401), or a wrong one (403)
  130  interrupted by Ctrl+C before the router answered"""

REPLICA_COMMANDS = {
    "drain": "send a replica no new work; it is drained when its in-flight work is done",
    "undrain": "return a draining or drained replica to service",
    "eject": "take a replica out of service now (in-flight work finishes)",
    "readmit": "return an ejected replica to service",
}


class _Parser(argparse.ArgumentParser):
    """Sub-subcommand errors keep ctl's one prefix: ``gpurouter ctl: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage()
        sub = self.prog.removeprefix(PROG).strip()
        self.exit(2, f"{PROG}: error: {sub + ': ' if sub else ''}{message}\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = "Talk to a running router's admin API (gpurouter serve, console or demo)."
    p.epilog = EXIT_CODES
    _add_connection(p, default_timeout=10.0)
    # The same options after the subcommand (`ctl status --admin URL`); SUPPRESS keeps a
    # subcommand from overwriting with its defaults what was given before it.
    connection = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _add_connection(connection, default_timeout=argparse.SUPPRESS)
    sub = p.add_subparsers(
        dest="ctl_command", required=True, metavar="SUBCOMMAND", parser_class=_Parser
    )
    _add_reads(sub, connection)
    _add_commands(sub, connection)
    from console.ctl.rollout import add_parser as add_rollout

    add_rollout(sub, connection, _Parser)


def _add_connection(p: argparse.ArgumentParser, default_timeout: object) -> None:
    """Where the admin API is and how to talk to it: before or after the subcommand."""
    p.add_argument(
        "--admin",
        metavar="URL",
        help=f"admin API address (default: ${ADMIN_ENV} or {DEFAULT_ADMIN})",
    )
    p.add_argument("--token", help=f"bearer token for the admin API (default: ${TOKEN_ENV})")
    p.add_argument("--actor", help="who you are, for the audit trail (default: ctl:$USER)")
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=default_timeout,
        metavar="S",
        help="seconds to wait for the router to answer (10)",
    )


def _add_reads(sub: Any, connection: argparse.ArgumentParser) -> None:
    status = sub.add_parser(
        "status", parents=[connection], help="the fleet at a glance: a table, or --json"
    )
    status.add_argument("--json", action="store_true", help="print the raw state JSON")
    events = sub.add_parser(
        "events", parents=[connection], help="the audit trail: every command and state change"
    )
    events.add_argument("--follow", action="store_true", help="keep printing new events")
    events.add_argument(
        "--since", type=_at_least(0), default=0, metavar="SEQ", help="only events after SEQ"
    )
    events.add_argument(
        "--count", type=_at_least(1), metavar="N", help="stop after N events (with --follow too)"
    )
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    decisions = sub.add_parser(
        "decisions", parents=[connection], help="recent routing decisions and why"
    )
    decisions.add_argument(
        "--limit", type=_at_least(1), default=20, metavar="N", help="how many (20)"
    )
    decisions.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_commands(sub: Any, connection: argparse.ArgumentParser) -> None:
    as_json = argparse.ArgumentParser(add_help=False, parents=[connection])
    as_json.add_argument("--json", action="store_true", help="print the audit event as JSON")
    strategy = sub.add_parser("strategy", parents=[as_json], help="switch the routing strategy")
    strategy.add_argument("name", metavar="NAME", help="a name from `gpurouter strategies`")
    strategy.add_argument(
        "--param",
        action="append",
        type=_param,
        default=[],
        metavar="K=V",
        help="a strategy parameter; V is read as JSON (1.5, true) or else as text; repeatable",
    )
    weight = sub.add_parser(
        "weight", parents=[as_json], help="pin a replica's weight, or release it"
    )
    weight.add_argument("replica", metavar="REPLICA")
    weight.add_argument("value", nargs="?", type=_weight, metavar="W")
    weight.add_argument("--release", action="store_true", help="back to the static/adaptive weight")
    batch = sub.add_parser(
        "batch", parents=[as_json], help="pin a replica's batch size, or release it"
    )
    batch.add_argument("replica", metavar="REPLICA")
    batch.add_argument("value", nargs="?", type=_batch_size, metavar="N")
    batch.add_argument("--release", action="store_true", help="back to the configured batch size")
    for name, help_text in REPLICA_COMMANDS.items():
        sub.add_parser(name, parents=[as_json], help=help_text).add_argument(
            "replica", metavar="REPLICA"
        )
    preempt = sub.add_parser(
        "preempt", parents=[as_json], help="free a replica now: re-queue its low-priority work"
    )
    preempt.add_argument("replica", metavar="REPLICA")
    preempt.add_argument(
        "--include-high", action="store_true", help="cancel high-priority work as well"
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: httpx and rich are not needed to build the parser.
    from console.ctl import AdminClient, CtlError
    from console.ctl.client import actor_name, token_from_environment

    try:
        with AdminClient(
            args.admin or os.environ.get(ADMIN_ENV) or DEFAULT_ADMIN,
            token=args.token or token_from_environment(),
            actor=args.actor or actor_name("ctl"),
            timeout_s=args.timeout,
        ) as client:
            _dispatch(client, args, out)
    except CtlError as exc:
        err.write(f"{PROG}: error: {exc}\n")
        return exc.exit_code
    except BrokenPipeError:
        # The reader went away (`| head -n 1`): stop quietly, as Unix tools do.
        silence(out)
        return 0
    except KeyboardInterrupt:
        # Ctrl+C is how `events --follow` is meant to end; elsewhere it cut a request short.
        if args.ctl_command == "events" and args.follow:
            return 0
        err.write(f"{PROG}: error: interrupted\n")
        return EXIT_INTERRUPTED
    return 0


def _dispatch(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    match args.ctl_command:
        case "status":
            _status(client, args, out)
        case "events":
            _events(client, args, out)
        case "decisions":
            for decision in client.decisions(args.limit):
                out.write(_line(decision, args.json, "decision") + "\n")
        case "rollout":
            _rollout(client, args, out)
        case _:
            event = client.command(_command_body(args))
            out.write((json.dumps(event) if args.json else _applied(event)) + "\n")


def _rollout(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    from console.ctl import UnreachableError
    from console.ctl.rollout import run as run_rollout

    try:
        run_rollout(client, args, out)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreachableError(
            f"the admin API's rollout is not what ctl expects ({exc!r})"
        ) from None


def _applied(event: dict[str, Any]) -> str:
    """The event's message, and where the router published it to its cluster, which
    routers applied it and which refused it."""
    text = str(event.get("message", ""))
    routers = event.get("applied_by")
    if not isinstance(routers, dict):
        return text
    applied = sorted(r for r, ok in routers.items() if ok)
    refused = sorted(r for r, ok in routers.items() if not ok)
    text += f"\napplied by {len(applied)} router(s): {', '.join(applied) or 'none'}"
    if refused:
        text += f"\nrefused by: {', '.join(refused)}"
    return text


def _command_body(args: argparse.Namespace) -> dict[str, Any]:
    """The admin API's JSON for a control subcommand (``router.control.parse_command``)."""
    from console.ctl import BadValueError

    name = args.ctl_command
    if name == "strategy":
        _check_strategy(args.name)
        return {"command": name, "name": args.name, "params": dict(args.param)}
    body: dict[str, Any] = {"command": name, "replica": args.replica}
    if name in ("weight", "batch"):
        if (args.value is None) == (not args.release):
            what = "W" if name == "weight" else "N"
            raise BadValueError(f"{name}: give either {what} or --release")
        body["weight" if name == "weight" else "size"] = args.value
    elif name == "preempt":
        body["include_high"] = args.include_high
    return body


def _check_strategy(name: str) -> None:
    """A name no router knows is a bad value (exit 2), not a refusal of a state (exit 1)."""
    from console.ctl import BadValueError
    from router.strategies import STRATEGIES

    if name not in STRATEGIES:
        known = ", ".join(sorted(STRATEGIES))
        raise BadValueError(f"unknown strategy {name!r}; known: {known}")


def _status(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    from console.ctl import UnreachableError
    from console.ctl.render import print_status

    state = client.state()
    if args.json:
        out.write(json.dumps(state, indent=2) + "\n")
        return
    try:
        print_status(state, out)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreachableError(f"the admin API's state is not what ctl expects ({exc!r})") from None


def _events(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    if not args.follow:
        for event in client.events(args.since)[: args.count]:
            out.write(_line(event, args.json, "event") + "\n")
        return
    stream = client.follow(args.since)
    try:
        for n, event in enumerate(stream, start=1):
            out.write(_line(event, args.json, "event") + "\n")
            out.flush()
            if n == args.count:
                break
    finally:
        stream.close()


def _line(item: dict[str, Any], as_json: bool, kind: str) -> str:
    from console.ctl import UnreachableError
    from console.ctl.render import decision_line, event_line

    if as_json:
        return json.dumps(item)
    try:
        return event_line(item) if kind == "event" else decision_line(item)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreachableError(
            f"the admin API's {kind} is not what ctl expects ({exc!r})"
        ) from None


# ---- argument types: argparse turns their ValueError/ArgumentTypeError into exit 2 ----------


def _positive(kind: type[float]) -> Any:
    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a positive number, not {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, not {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, not {value}")
        return value

    return parse


def _weight(text: str) -> float:
    """A weight in its range (router/operator_values.py), refused before anything is sent."""
    from router.operator_values import weight_problem

    value: float = _positive(float)(text)
    problem = weight_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _batch_size(text: str) -> int:
    from router.operator_values import batch_size_problem

    value: int = _at_least(1)(text)
    problem = batch_size_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def _param(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected K=V, not {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw  # plain text: `--param key=session` needs no JSON quotes
    return key.strip(), value
