"""Every example scenario runs on the simulator and all its checks hold."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from router.scenario import load_scenario
from tests.scenario_helpers import EXAMPLES, Run, run_cli

SCENARIOS = sorted(EXAMPLES.glob("*.yaml"))


@functools.cache
def simulated(path: Path) -> Run:
    """Each example is simulated once per test session (the output is deterministic)."""
    return run_cli(str(path), "--simulate", "--json")


def test_the_four_drills_are_there() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"strategy-comparison", "drain-a100", "replica-failure", "preempt-burst"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_an_example_scenario_passes_in_simulate_mode(path: Path) -> None:
    run = simulated(path)
    assert run.code == 0, run.err
    summary = run.summary
    assert summary["passed"] is True
    assert summary["lost"] == 0
    assert all(check["ok"] for check in summary["checks"])
    scenario = load_scenario(path)
    samples = [line for line in run.lines if line["kind"] == "sample"]
    # One line per second of scenario time, each with the fleet's state.
    assert [s["t"] for s in samples] == [float(t) for t in range(1, int(scenario.duration_s) + 1)]
    assert set(samples[0]["replicas"]) == {r.id for r in scenario.fleet.config.replicas}
    actions = [line for line in run.lines if line["kind"] == "action"]
    assert len(actions) == len(scenario.actions)
    assert all(a["ok"] for a in actions)


def test_the_strategy_switch_shows_in_the_lines_and_cuts_the_imbalance() -> None:
    run = simulated(EXAMPLES / "strategy-comparison.yaml")
    samples = {s["t"]: s for s in run.lines if s["kind"] == "sample"}
    assert samples[29.0]["strategy"] == "round-robin"
    assert samples[30.0]["strategy"] == "weighted-least-connections"
    assert samples[60.0]["imbalance_factor"] < samples[29.0]["imbalance_factor"] / 2


def test_a_simulated_run_is_the_same_every_time() -> None:
    path = EXAMPLES / "drain-a100.yaml"
    assert run_cli(str(path), "--simulate", "--json").out == simulated(path).out
