"""``gpurouter ctl rollout canary ...``, ``switch``, ``switch-back``, ``release`` and ``split``:
the traffic split between two versions of a model (router/rollout/splits.py).

``canary start VERSION`` puts the new version on ``--replicas`` (moved there by the updater
when they do not run it yet) and steps its share up on its own, or, with ``--manual``, as the
operator says (``canary step PERCENT``); ``canary promote`` and ``canary abort`` end it.
``switch``, ``switch-back`` and ``release`` steer the fleet file's blue-green set. Each answer
is the split's state, as a summary or, with ``--json``, the admin API's JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from console.ctl.client import AdminClient

__all__ = ["add_parsers", "render", "run"]

BLUE_GREEN = {
    "switch": "blue-green: every request of the model to the green set; drain the blue set",
    "switch-back": "blue-green: back to the blue set (until it is released)",
    "release": "blue-green: end the split once the blue set is empty",
}
CANARY = {
    "status": "the canary's split, figures and phase",
    "promote": "end the split on the new version; roll the rest of the model to it",
    "abort": "split back to 0% now; the canary replicas back to the old version",
}


def add_parsers(actions: Any, as_json: argparse.ArgumentParser, parser_class: type) -> None:
    """``canary`` and the blue-green actions, under ``ctl rollout``."""
    canary = actions.add_parser(
        "canary", parents=[as_json], help="a canary: a share of a model's requests to a version"
    )
    steps = canary.add_subparsers(
        dest="canary_action", required=True, metavar="ACTION", parser_class=parser_class
    )
    start = steps.add_parser("start", parents=[as_json], help="start a canary of VERSION")
    _add_start(start)
    step = steps.add_parser("step", parents=[as_json], help="set the new version's share")
    step.add_argument("percent", type=float, metavar="PERCENT", help="0 to 100")
    for name, help_text in CANARY.items():
        steps.add_parser(name, parents=[as_json], help=help_text)
    actions.add_parser("split", parents=[as_json], help="the traffic split, canary or blue-green")
    for name, help_text in BLUE_GREEN.items():
        actions.add_parser(name, parents=[as_json], help=help_text)


def _add_start(p: argparse.ArgumentParser) -> None:
    from console.ctl.rollout import add_updater_options

    p.add_argument("canary_version", metavar="VERSION", help="the new version's model name")
    p.add_argument("--replicas", metavar="IDS", help="the canary replicas, separated by commas")
    p.add_argument("--model", metavar="NAME", help="the stable name (default: theirs)")
    p.add_argument("--manual", action="store_true", help="the operator moves the share")
    p.add_argument("--steps", metavar="P,P,...", help="percentages, e.g. 5,25,50,100")
    p.add_argument("--dwell", type=float, metavar="S", dest="dwell_s")
    p.add_argument("--window", type=float, metavar="S", dest="window_s")
    p.add_argument("--min-requests", type=int, metavar="N")
    p.add_argument("--max-error-increase", type=float, metavar="F", dest="max_error_rate_increase")
    p.add_argument("--max-ttft-ratio", type=float, metavar="R")
    add_updater_options(p)


def start_body(args: argparse.Namespace) -> dict[str, Any]:
    """The admin API's ``canary``: only what was given, the router fills in the rest."""
    from console.ctl import BadValueError
    from console.ctl.rollout import updater_settings

    rules: dict[str, Any] = {}
    for key in ("dwell_s", "window_s", "min_requests", "max_error_rate_increase"):
        if getattr(args, key) is not None:
            rules[key] = getattr(args, key)
    if args.max_ttft_ratio is not None:
        rules["max_ttft_ratio"] = args.max_ttft_ratio
    if args.steps is not None:
        try:
            rules["steps"] = [float(p) for p in args.steps.split(",")]
        except ValueError:
            message = f"--steps: percentages separated by commas, not {args.steps!r}"
            raise BadValueError(message) from None
    settings: dict[str, Any] = {"canary": rules} if rules else {}
    settings.update(updater_settings(args, "canary start"))
    body: dict[str, Any] = {"action": "canary", "version": args.canary_version}
    if args.replicas is not None:
        body["replicas"] = [r.strip() for r in args.replicas.split(",") if r.strip()]
    if args.model is not None:
        body["model"] = args.model
    if args.manual:
        body["manual"] = True
    if settings:
        body["settings"] = settings
    return body


def run(client: AdminClient, args: argparse.Namespace, out: TextIO) -> None:
    action = args.rollout_action
    split: dict[str, Any] | None
    if action == "split" or (action == "canary" and args.canary_action == "status"):
        split = client.split()
    elif action == "canary":
        split = client.split_action(_canary_body(args))
    else:
        split = client.split_action({"action": action.replace("-", " ")})
    if args.json:
        out.write(json.dumps(split, indent=2) + "\n")
        return
    out.write(render(split))


def _canary_body(args: argparse.Namespace) -> dict[str, Any]:
    match args.canary_action:
        case "start":
            return start_body(args)
        case "step":
            return {"action": "step", "percent": args.percent}
        case other:
            return {"action": other}


def render(split: dict[str, Any] | None) -> str:
    """A split's state as a few lines: which versions, the share, the phase and the figures."""
    if split is None:
        return "no traffic split\n"
    share = split["share"]
    lines = [
        f"{split['id']}: {split['model']} {split['phase']}; {split['new']} {share:.0%}, "
        f"{split['old']} {1 - share:.0%}"
    ]
    if split["kind"] == "canary":
        lines.append(f"canary replicas: {', '.join(split['replicas'])}")
        for side in ("new", "old"):
            f = split["figures"][side]
            p99 = "-" if f["p99_ttft_s"] is None else f"{f['p99_ttft_s'] * 1000:.0f} ms"
            lines.append(
                f"{side} {split[side]}: {f['requests']} requests, {f['errors']} errors "
                f"({f['error_rate']:.1%}), p99 TTFT {p99}"
            )
        for key in ("verdict", "error"):
            if split.get(key) and (key == "verdict" or split[key] != split.get("verdict")):
                lines.append(f"{key}: {split[key]}")
    else:
        for side in ("blue", "green"):
            for rid, r in split[side].items():
                held = f"{r['in_flight']} in flight"
                lines.append(f"{side} {rid}: {r['state']}, {r['version']}, {held}")
        if split["phase"] == "switched":
            empty = "empty" if split["emptied"] else f"{split['in_flight']} in flight"
            lines.append(f"blue set: {empty}")
    return "\n".join(lines) + "\n"
