"""``gpurouter run SCENARIO.yaml``: a scripted run, on the simulator or live, judged by checks.

Exit codes: 0 every check held; 1 a check failed (each named on stderr with what was
measured); 2 the scenario (or the fleet file it names) is wrong, each problem with file, line
and key; 3 a live run could not be judged as written: the machine could not keep up (stderr
says how far behind it fell), or a check missed only because an action took effect late
inside its window. docs/scenarios.md describes the file and the lines printed.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from router.errors import ConfigError, GpuRouterError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", metavar="SCENARIO.yaml", help="the scenario file")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="run on the fleet simulator (virtual time, seconds of wall time) instead of live",
    )
    p.add_argument(
        "--json", action="store_true", help="print JSON lines (samples, actions, summary)"
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: the simulator and aiohttp are not needed to build the parser.
    from router.scenario import load_scenario, run_simulated
    from router.scenario.runner_live import run_live_blocking

    def emit(line: dict[str, Any]) -> None:
        out.write((json.dumps(line) if args.json else _text(line)) + "\n")
        out.flush()

    try:
        scenario = load_scenario(args.scenario)
        if args.simulate:
            report = run_simulated(scenario, emit)
        else:
            report = run_live_blocking(scenario, emit)
    except ConfigError as exc:
        for problem in exc.problems:
            err.write(f"gpurouter run: {problem}\n")
        return 2
    except GpuRouterError as exc:
        err.write(f"gpurouter run: {exc}\n")
        return 2
    except OSError as exc:
        err.write(f"gpurouter run: cannot start the live run: {exc}\n")
        return 1
    emit(report.summary())
    if not report.judged:
        err.write(
            f"gpurouter run: {report.verdict}; run it on a less busy machine, or slower "
            "(a lower fleet.time_scale)\n"
        )
        return report.exit_code
    for failed in report.judged_failures:
        err.write(f"gpurouter run: check failed: {failed} (line {failed.line})\n")
    for unjudged in report.unjudged:
        err.write(
            f"gpurouter run: check not judged: {unjudged.name}: {unjudged.not_judged} "
            f"(line {unjudged.line})\n"
        )
    return report.exit_code


def _text(line: dict[str, Any]) -> str:
    kind = line["kind"]
    if kind == "sample":
        replicas = " ".join(
            f"{rid}:{_short(r['state'])}{r['utilization']:.2f}"
            for rid, r in line["replicas"].items()
        )
        return (
            f"t={line['t']:>6.1f}s {line['strategy']:<28} {line['throughput_rps']:6.1f} req/s "
            f"queue {line['queue_depth']:>4} in flight {line['in_flight']:>4} "
            f"imbalance {line['imbalance_factor']:6.2f} ({line['band']}) {replicas}"
        )
    if kind == "action":
        status = "ok" if line["ok"] else "REFUSED"
        return f"t={line['t']:>6.1f}s action {line['action']}: {status}: {line['message']}"
    return _summary_text(line)


def _short(state: str) -> str:
    # Utilization follows the state letter: a=active, d=draining, D=drained, e=ejected.
    return {"active": "a", "draining": "d", "drained": "D", "ejected": "e"}.get(state, "?")


def _summary_text(line: dict[str, Any]) -> str:
    counts = ", ".join(
        f"{k} {line[k]}"
        for k in ("offered", "completed", "failed", "rejected", "expired", "unfinished", "lost")
    )
    rows = [f"{line['scenario']} ({line['mode']}): {counts}"]
    for check in line["checks"]:
        mark = ("PASS" if check["ok"] else "FAIL") if check["judged"] else "----"
        measured = "unbounded" if check["measured"] is None else check["measured"]
        note = "" if check["judged"] else f" (not judged: {check['not_judged']})"
        rows.append(
            f"  {mark} {check['name']}: measured {measured}, expected {check['expected']}{note}"
        )
    machine = line.get("machine")
    if machine is not None and line["judged"]:
        rows.append(machine["text"])
    rows.append(line["verdict"])
    return "\n".join(rows)
