"""``gpurouter run SCENARIO.yaml``: a scripted run, on the simulator or live, judged by checks.

Exit codes: 0 every check held; 1 a check failed (each named on stderr with what was
measured); 2 the scenario (or the fleet file it names) is wrong, each problem with file, line
and key; 3 a live run could not be judged as written: the machine could not keep up (stderr
says how far behind it fell), or a check missed only because an action took effect late
inside its window; 130 Ctrl+C stopped the run: the summary of what ran until then is
printed, no check judged. docs/scenarios.md describes the file and the lines printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from router.errors import ConfigError, GpuRouterError

if TYPE_CHECKING:
    from router.scenario import RunReport, Scenario
    from router.scenario.report import Emit

PROG = "gpurouter run"


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
    from router.scenario import load_scenario

    def emit(line: dict[str, Any]) -> None:
        out.write((json.dumps(line) if args.json else _text(line)) + "\n")
        out.flush()

    try:
        scenario = load_scenario(args.scenario)
        report = _simulated(scenario, emit) if args.simulate else _live(scenario, emit)
    except ConfigError as exc:
        for problem in exc.problems:
            err.write(f"{PROG}: {problem}\n")
        return 2
    except GpuRouterError as exc:
        err.write(f"gpurouter run: {exc}\n")
        return 2
    except OSError as exc:
        err.write(f"gpurouter run: cannot start the live run: {exc}\n")
        return 1
    emit(report.summary())
    if report.interrupted_at is not None:
        err.write(f"{PROG}: {report.verdict}; the report above is what ran until then\n")
        return report.exit_code
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


def _simulated(scenario: Scenario, emit: Emit) -> RunReport:
    from router.scenario import run_simulated

    with _sigint_flag() as stopped:
        return run_simulated(scenario, emit, stopped)


@contextmanager
def _sigint_flag() -> Iterator[Callable[[], bool]]:
    """Ctrl+C in the block raises a flag (the simulator ends at its next second) instead of
    an exception in the middle of the router's bookkeeping."""
    raised: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _: raised.append(signum))
    try:
        yield lambda: bool(raised)
    finally:
        signal.signal(signal.SIGINT, previous)


def _live(scenario: Scenario, emit: Emit) -> RunReport:
    return asyncio.run(_live_until_stopped(scenario, emit))


async def _live_until_stopped(scenario: Scenario, emit: Emit) -> RunReport:
    from router.scenario.runner_live import run_live

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await run_live(scenario, emit, stop=stop)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _text(line: dict[str, Any]) -> str:
    kind = line["kind"]
    if kind == "sample":
        replicas = " ".join(_replica(rid, r) for rid, r in line["replicas"].items())
        return (
            f"t={line['t']:>6.1f}s {line['strategy']:<28} {line['throughput_rps']:6.1f} req/s "
            f"queue {line['queue_depth']:>4} in flight {line['in_flight']:>4} "
            f"imbalance {line['imbalance_factor']:6.2f} ({line['band']})  busy {replicas}"
        )
    if kind == "action":
        status = "ok" if line["ok"] else "REFUSED"
        return f"t={line['t']:>6.1f}s action {line['action']}: {status}: {line['message']}"
    return _summary_text(line)


def _replica(rid: str, r: dict[str, Any]) -> str:
    """``a100-0 42%``: in flight over batch size; a replica out of rotation says so."""
    busy = f"{round(100 * r['utilization'])}%"
    return f"{rid} {busy}" if r["state"] == "active" else f"{rid} {r['state']} {busy}"


def _summary_text(line: dict[str, Any]) -> str:
    counts = ", ".join(
        f"{k} {line[k]}"
        for k in (
            "offered", "completed", "failed", "rejected", "expired", "unfinished", "stopped",
            "lost",
        )
        if k in line
    )  # fmt: skip
    rows = [f"{line['scenario']} ({line['mode']}): {counts}"]
    if isinstance(line.get("rollout"), dict):
        rows += _rollout_rows(line["rollout"])
    if isinstance(line.get("canary"), dict):
        rows += _canary_rows(line["canary"])
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


def _rollout_rows(rollout: dict[str, Any]) -> list[str]:
    """What the rollout step cost the traffic, and what the router predicted it would."""
    traffic = rollout.get("traffic") or {}
    ttft = traffic.get("ttft_p99_s") or {}
    lost = traffic.get("lost") or {}
    took = rollout.get("duration_s")
    rows = [
        f"  rollout {rollout['phase']}"
        + ("" if took is None else f" in {took:.1f} s")
        + f": capacity at lowest {rollout['capacity_lowest']:.1%}, "
        f"peak queue {traffic.get('peak_queue', '-')}, p99 TTFT before/during/after "
        + "/".join(_secs(ttft.get(k)) for k in ("before", "during", "after"))
        + f", lost {sum(lost.values()) if lost else 0}"
    ]
    predicted = rollout.get("prediction")
    if isinstance(predicted, dict):
        rows.append(
            f"  predicted: capacity at lowest {predicted['capacity_lowest']:.1%}, "
            f"peak queue {predicted['peak_queue']}, p99 TTFT during "
            f"{_secs(predicted.get('ttft_p99_s'))}, duration {_secs(predicted.get('duration_s'))}"
        )
    return rows


def _canary_rows(canary: dict[str, Any]) -> list[str]:
    """When the canary went back to 0% and why, with the figures the judge decided on."""
    back = canary.get("rolled_back_at")
    ended = canary.get("ended_at")
    row = f"  canary {canary['phase']}: started at {canary['started_at']:.1f} s"
    if back is not None:
        row += f", back to 0% at {back:.1f} s"
    if ended is not None:
        row += f", ended at {ended:.1f} s"
    rows = [row + f"; share {canary['share']:.0%}, on the new version {len(canary['on_new'])}"]
    why = canary.get("verdict") or canary.get("error")
    if why:
        rows.append(f"  {why}")
    return rows


def _secs(value: Any) -> str:
    return "-" if value is None else f"{value:.2f} s"
