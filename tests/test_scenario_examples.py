"""Every example scenario runs on the simulator and all its checks hold."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from router.scenario import load_scenario
from tests.scenario_helpers import EXAMPLES, Run, run_cli

SIMULATED_ELSEWHERE = frozenset({"rollout-mixed"})
"""Run on the simulator by tests/test_scenario_rollout.py (with its rollout's summary), not
again here."""
SCENARIOS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.stem not in SIMULATED_ELSEWHERE)


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


QUOTED: dict[str, tuple[tuple[str | float, str], ...]] = {
    # (a check's name, or a sample's second for its imbalance factor), and how it is written
    "strategy-comparison": (
        (5.0, "reads {:.1f} at"),
        ("round-robin is unbalanced", "20-30 s: {:.1f}"),
        (40.0, "reads {:.1f} at 40 s"),
        ("imbalance falls under 3", "50-60 s is {:.1f}"),
        ("round-robin p99 TTFT over 5 s", "p99 TTFT is {:.1f} s"),
        ("round-robin falls behind the load", "completes {:.0%} of capacity"),
        ("p99 TTFT under 2 s after the switch", "TTFT is {:.1f} s"),
        ("weighted routing serves the load and the backlog", "completes {:.0%} of capacity,"),
    ),
    "drain-a100": (
        ("p99 TTFT under 2 s through the drill", "With --simulate: p99 TTFT {:.2f} s"),
        ("a100-0 takes work again", "a100-0 takes {:.0f} requests"),
    ),
    "preempt-burst": (
        ("high priority overtakes the queue", "high-priority p99 TTFT {:.1f} s"),
        ("low priority waits meanwhile", "low priority waits {:.1f} s"),
        ("only what streamed on a100-0 fails", "and {:.0f} low-priority requests fail"),
    ),
    "canary-failing": (("p99 TTFT all through", "p99 TTFT {:.2f} s all through"),),
    "canary-weak-card": (("p99 TTFT all through", "p99 TTFT {:.2f} s all through"),),
    "replica-failure": (
        ("few failures at the kill", "With --simulate: {:.0f} requests fail"),
        ("p99 TTFT under 2 s while a100-1 is out", "is {:.2f} s"),
    ),
}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_an_example_comment_quotes_what_the_simulator_prints(path: Path) -> None:
    """The figures an example's comment gives for --simulate are the ones it prints, so that
    a change to the router that moves them fails here until the comment says so."""
    run = simulated(path)
    checks = {c["name"]: c["measured"] for c in run.summary["checks"]}
    imbalance = {s["t"]: s["imbalance_factor"] for s in run.lines if s["kind"] == "sample"}
    comment = path.read_text(encoding="utf-8").split("\nname:")[0]
    for source, written in QUOTED[path.stem]:
        value = imbalance[source] if isinstance(source, float) else checks[source]
        assert written.format(value) in comment, (source, value)
