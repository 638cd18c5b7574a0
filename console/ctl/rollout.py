"""``gpurouter ctl rollout``: start, follow and steer a model rollout (router/rollout/).

``start VERSION`` with the settings that differ from the fleet file's ``rollout:`` section
(the floor, the order, the deadlines, the updater), or with ``--dry-run`` the plan and the
simulator's prediction, nothing started; ``status`` prints the plan and each
replica's step; ``pause``, ``resume``, ``abort`` and ``rollback`` steer the one going. Each
answer is the rollout's state, as a summary or, with ``--json``, the admin API's JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from console.ctl.client import AdminClient

__all__ = ["add_parser", "render", "render_preview", "run"]

STEERING = {
    "pause": "hold the rollout once its current wave is back in service",
    "resume": "go on with a paused rollout",
    "abort": "stop after the current step; replicas drained and not updated are readmitted",
    "rollback": "move every updated replica back to its old version (aborts one going first)",
}


SPLIT_ACTIONS = frozenset({"canary", "split", "switch", "switch-back", "release"})
"""``ctl rollout`` actions of the traffic split (console/ctl/split.py)."""


def add_parser(sub: Any, parent: argparse.ArgumentParser, parser_class: type) -> None:
    """``rollout`` and its own subcommands; ``parent`` carries the connection options."""
    as_json = argparse.ArgumentParser(add_help=False, parents=[parent])
    as_json.add_argument("--json", action="store_true", help="print the rollout's state as JSON")
    rollout = sub.add_parser(
        "rollout", parents=[parent], help="model rollouts: start, follow, steer"
    )
    actions = rollout.add_subparsers(
        dest="rollout_action", required=True, metavar="ACTION", parser_class=parser_class
    )
    start = actions.add_parser("start", parents=[as_json], help="roll a new version over the fleet")
    _add_start(start)
    actions.add_parser("status", parents=[as_json], help="the rollout's plan and each step")
    for name, help_text in STEERING.items():
        actions.add_parser(name, parents=[as_json], help=help_text)
    from console.ctl.split import add_parsers

    add_parsers(actions, as_json, parser_class)


def _add_start(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "rollout_version", metavar="VERSION", help="the model name the replicas will serve"
    )
    p.add_argument("--floor", type=float, metavar="F", help="share of capacity kept (0..1)")
    p.add_argument(
        "--order",
        metavar="ORDER",
        help="weakest-first, strongest-first, or replica ids separated by commas",
    )
    p.add_argument("--drain-timeout", type=float, metavar="S", dest="drain_timeout_s")
    p.add_argument("--on-drain-timeout", choices=("wait", "preempt"))
    p.add_argument("--ready-timeout", type=float, metavar="S", dest="ready_timeout_s")
    p.add_argument("--check-interval", type=float, metavar="S", dest="check_interval_s")
    add_updater_options(p)


def add_updater_options(p: argparse.ArgumentParser) -> None:
    """The updater's options, shared by ``start`` and ``canary start``."""
    p.add_argument(
        "--command",
        dest="update_command",
        metavar="CMD",
        help="update command ({replica} {node} {url} {version})",
    )
    p.add_argument("--command-timeout", type=float, metavar="S")
    p.add_argument(
        "--http-url", metavar="URL", help="update by an HTTP request to this URL template"
    )
    p.add_argument("--http-method", metavar="M")
    p.add_argument("--http-body", metavar="JSON", help="its body template")
    p.add_argument("--http-expect", type=int, metavar="STATUS", help="the status that means done")
    p.add_argument("--http-timeout", type=float, metavar="S")
    p.add_argument(
        "--load-estimate",
        type=float,
        metavar="S",
        dest="load_estimate_s",
        help="how long an update keeps a replica out, for the prediction",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and the simulator's prediction; start nothing",
    )


def start_body(args: argparse.Namespace) -> dict[str, Any]:
    """The admin API's ``start``: only what was given, the router fills in the rest."""

    settings: dict[str, Any] = {}
    for key in (
        "floor",
        "drain_timeout_s",
        "on_drain_timeout",
        "ready_timeout_s",
        "check_interval_s",
        "load_estimate_s",
    ):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    if args.order is not None:
        named = args.order in ("weakest-first", "strongest-first")
        settings["order"] = args.order if named else [r.strip() for r in args.order.split(",")]
    settings.update(updater_settings(args, "start"))
    return {"action": "start", "version": args.rollout_version, "settings": settings}


def updater_settings(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """``{"updater": ...}`` when one was given on the command line, else nothing."""
    from console.ctl import BadValueError

    updater = _updater(args)
    if updater == "both":
        raise BadValueError(f"{command}: give --command or --http-url, not both")
    return {} if updater is None else {"updater": updater}


def _updater(args: argparse.Namespace) -> dict[str, Any] | str | None:
    command = {"run": args.update_command, "timeout_s": args.command_timeout}
    http = {
        "url": args.http_url,
        "method": args.http_method,
        "body": args.http_body,
        "expect_status": args.http_expect,
        "timeout_s": args.http_timeout,
    }
    if args.update_command is not None and args.http_url is not None:
        return "both"
    if args.update_command is not None:
        return {"command": {k: v for k, v in command.items() if v is not None}}
    if args.http_url is not None:
        return {"http": {k: v for k, v in http.items() if v is not None}}
    return None


def run(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    action = args.rollout_action
    if action in SPLIT_ACTIONS:
        from console.ctl.split import run as run_split

        run_split(client, args, out)
        return
    if action == "status":
        rollout = client.rollout()
    elif action == "start" and args.dry_run:
        preview = client.rollout_preview(start_body(args))
        out.write(json.dumps(preview, indent=2) + "\n" if args.json else render_preview(preview))
        return
    elif action == "start":
        rollout = client.rollout_action(start_body(args))
    else:
        rollout = client.rollout_action({"action": action})
    if args.json:
        out.write(json.dumps(rollout, indent=2) + "\n")
        return
    out.write(render(rollout))


def render(rollout: dict[str, Any] | None) -> str:
    """A rollout's state as a few lines: what, where it stands, capacity, and each replica."""
    if rollout is None:
        return "no rollout yet\n"
    plan = rollout["plan"]
    waves = plan["waves"]
    wave = rollout["wave"]
    where = "not started" if wave is None else f"wave {wave + 1} of {len(waves)}"
    lines = [
        f"{rollout['id']}: {rollout['version']} {rollout['phase']}, {where}",
        f"capacity in service {rollout['capacity_now']:.0%} now, "
        f"{rollout['capacity_lowest']:.0%} at lowest (floor {plan['floor']:.0%}); "
        f"{rollout['requests_moved']} requests moved, {rollout['waited_for']} waited for",
    ]
    wave_of = {r: i + 1 for i, w in enumerate(waves) for r in w["replicas"]}
    width = max([len("REPLICA"), *(len(r) for r in plan["order"])])
    lines.append(f"{'REPLICA':<{width}}  WAVE  {'STEP':<11}  VERSION")
    for r in plan["order"]:
        step, version = rollout["steps"][r], rollout["versions"][r]
        lines.append(f"{r:<{width}}  {wave_of[r]:>4}  {step:<11}  {version}")
    if rollout["error"]:
        lines.append(f"error: {rollout['error']}")
    lines += _side_by_side(rollout.get("prediction"), rollout.get("measured"))
    return "\n".join(lines) + "\n"


def render_preview(preview: dict[str, Any]) -> str:
    """A rollout not started: its waves, then what the simulator predicts it costs."""
    plan = preview["plan"]
    lines = [
        f"preview: {preview['version']} in {len(plan['waves'])} waves "
        f"(floor {plan['floor']:.0%}), nothing started",
        f"update: {preview['updater']}",
    ]
    for i, wave in enumerate(plan["waves"], 1):
        lines.append(
            f"wave {i}: {', '.join(wave['replicas'])} (leaves {wave['remaining']:.0%} in service)"
        )
    p = preview["prediction"]
    if p is None:
        lines.append(preview.get("prediction_error") or "no prediction")
        return "\n".join(lines) + "\n"
    lines.append(
        f"predicted at {p['arrival_rps']:.1f} req/s, each replica out {preview['load_s']:g} s: "
        f"capacity at lowest {p['capacity_lowest']:.0%}, peak queue {p['peak_queue']}, "
        f"p99 TTFT during {_seconds(p['ttft_p99_s'])}, duration {_seconds(p['duration_s'])}"
    )
    if p.get("note"):
        lines.append(f"note: {p['note']}")
    return "\n".join(lines) + "\n"


_FIGURES = (
    ("capacity at lowest", "capacity_lowest"),
    ("peak queue", "peak_queue"),
    ("p99 TTFT during", "ttft_p99_s"),
    ("duration", "duration_s"),
)


def _side_by_side(predicted: dict[str, Any] | None, measured: dict[str, Any] | None) -> list[str]:
    """The prediction beside the measurement, figure by figure (what there is of either)."""
    if predicted is None and measured is None:
        return []
    lines = [f"{'':<20}{'PREDICTED':>11}{'MEASURED':>11}"]
    for label, key in _FIGURES:
        shown = [_figure(key, None if f is None else f.get(key)) for f in (predicted, measured)]
        lines.append(f"{label:<20}{shown[0]:>11}{shown[1]:>11}")
    return lines


def _figure(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "capacity_lowest":
        return f"{value:.1%}"
    if key == "peak_queue":
        return str(value)
    return _seconds(value)


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} s"
