"""Checks: how each is measured, and a failing one exits 1 naming itself and the value."""

from __future__ import annotations

import math
from pathlib import Path

from router.scenario import load_scenario, run_simulated
from router.scenario.report import RunReport
from tests.scenario_helpers import run_cli, scenario_file

SHORT = """\
fleet: FLEET
seed: 7
workload:
  lengths: {lognormal: {prompt: [200, 300], output: [100, 150]}}
  phases:
    - {duration: 10, rate: 20, priorities: {high: 1, low: 1}}
drain: 20
"""


def simulate(tmp_path: Path, text: str) -> RunReport:
    return run_simulated(load_scenario(scenario_file(tmp_path, text)), lambda _: None)


def measured(report: RunReport) -> dict[str, object]:
    return {c.name: c.measured for c in report.checks}


def test_a_failing_check_exits_1_naming_it_and_what_was_measured(tmp_path: Path) -> None:
    text = SHORT + "checks:\n  - {name: impossible latency, metric: ttft_p99_s, max: 0.000001}\n"
    run = run_cli(str(scenario_file(tmp_path, text)), "--simulate", "--json")
    assert run.code == 1
    (check,) = run.summary["checks"]
    assert check["name"] == "impossible latency"
    assert check["ok"] is False
    assert check["measured"] > 0.000001
    assert check["expected"] == "<= 1e-06"
    assert run.err.startswith("gpurouter run: check failed: impossible latency: measured ")
    assert run.err.endswith("expected <= 1e-06 (line 9)\n")


def test_a_refused_command_fails_the_run(tmp_path: Path) -> None:
    text = SHORT + (
        "actions:\n"
        "  - {at: 1, command: drain, replica: a100-0}\n"
        "  - {at: 2, command: drain, replica: a100-0}\n"
    )
    run = run_cli(str(scenario_file(tmp_path, text)), "--simulate", "--json")
    assert run.code == 1
    refused = [line for line in run.lines if line["kind"] == "action" and not line["ok"]]
    assert [line["t"] for line in refused] == [2.0]
    assert "action at line 10 (drain replica=a100-0) applied" in run.err


def test_counts_add_up_and_latencies_split_by_priority(tmp_path: Path) -> None:
    text = SHORT + (
        "checks:\n"
        "  - {name: offered, metric: offered, min: 0}\n"
        "  - {name: completed, metric: completed, min: 0}\n"
        "  - {name: completed high, metric: completed, priority: high, min: 0}\n"
        "  - {name: completed low, metric: completed, priority: low, min: 0}\n"
        "  - {name: early, metric: completed, to: 5, min: 0}\n"
        "  - {name: late, metric: completed, from: 5, min: 0}\n"
        "  - {name: lost, metric: lost, max: 0}\n"
    )
    report = simulate(tmp_path, text)
    m = measured(report)
    assert report.passed
    assert m["offered"] == m["completed"] == report.counts["offered"] > 100
    assert m["completed high"] + m["completed low"] == m["completed"]  # type: ignore[operator]
    assert m["early"] + m["late"] == m["completed"]  # type: ignore[operator]
    assert m["lost"] == 0.0


def test_per_second_checks_read_every_sample_or_their_mean(tmp_path: Path) -> None:
    text = SHORT + (
        "checks:\n"
        "  - {name: worst, metric: in_flight, max: 100000}\n"
        "  - {name: mean, metric: in_flight, max: 100000, aggregate: mean}\n"
        "  - {name: least, metric: in_flight, min: 0}\n"
    )
    report = simulate(tmp_path, text)
    m = measured(report)
    values = [s.in_flight for s in report.measured.recorder.samples]
    assert len(values) == 10
    assert m["worst"] == max(values)
    assert m["least"] == min(values)
    assert m["mean"] == sum(values) / len(values)


def test_a_request_still_waiting_at_the_end_makes_ttft_unbounded(tmp_path: Path) -> None:
    """As the simulator counts it: a request that never got a token was later than any."""
    text = SHORT.replace("drain: 20", "drain: 0")
    text += "checks:\n  - {metric: ttft_p99_s, from: 9.5, max: 60}\n"
    report = simulate(tmp_path, text)
    assert report.counts["unfinished"] > 0
    (check,) = report.checks
    assert check.measured == math.inf
    assert not check.ok
    assert check.to_dict()["measured"] is None
    assert "measured unbounded" in str(check)


def test_state_and_dispatch_checks_follow_a_drain(tmp_path: Path) -> None:
    text = SHORT + (
        "actions:\n"
        "  - {at: 3, command: drain, replica: a100-0}\n"
        "checks:\n"
        "  - {name: before, metric: state, replica: a100-0, at: 2.9, equals: active}\n"
        "  - {name: after, metric: state, replica: a100-0, at: 25, equals: drained}\n"
        "  - {name: sent before, metric: dispatched, replica: a100-0, to: 3, min: 1}\n"
        "  - {name: sent after, metric: dispatched, replica: a100-0, from: 3.0001, max: 0}\n"
        "  - {name: others, metric: dispatched, from: 3.0001, min: 1}\n"
    )
    report = simulate(tmp_path, text)
    assert report.passed, [str(c) for c in report.failed]
    assert measured(report)["after"] == "drained"


def test_throughput_fraction_is_against_the_fleet_capacity(tmp_path: Path) -> None:
    # The conversation trace, as the examples use: its capacity is measured once per session.
    text = SHORT.replace("{lognormal: {prompt: [200, 300], output: [100, 150]}}", "{trace: conv}")
    text += "checks:\n  - {name: f, metric: throughput_fraction, from: 2, to: 10, max: 1}\n"
    report = simulate(tmp_path, text)
    assert report.capacity_rps is not None
    (check,) = report.checks
    assert isinstance(check.measured, float)
    # 20 requests/s offered: what completed is about that share of the capacity.
    assert 0.5 * 20 / report.capacity_rps < check.measured < 1.5 * 20 / report.capacity_rps
