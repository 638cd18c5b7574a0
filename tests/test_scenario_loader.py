"""Scenario files: strict like fleet files; every problem with file, line and key; exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.errors import ConfigError
from router.request import Priority
from router.scenario import load_scenario, parse_scenario
from router.scenario.schema import Lengths
from tests.scenario_helpers import MIXED, run_cli, scenario_file

GOOD = """\
fleet: FLEET
workload:
  phases:
    - {duration: 10, rate: 5}
"""


def problems(text: str, tmp_path: Path) -> list[str]:
    path = scenario_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    return [f"{p.line}: {p.key}: {p.message}" for p in info.value.problems]


def test_a_minimal_scenario_takes_the_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(scenario_file(tmp_path, GOOD))
    assert scenario.name == "scenario"
    assert scenario.fleet.file == MIXED
    assert scenario.fleet.emulated is True
    assert scenario.fleet.time_scale == 1.0
    (phase,) = scenario.phases
    assert phase.lengths == Lengths(trace="conv")
    assert dict(phase.priorities) == {Priority.NORMAL: 1.0}
    assert (phase.arrivals, phase.rate_rps, phase.load) == ("poisson", 5.0, None)
    assert scenario.duration_s == 10.0
    assert scenario.strategy is None
    assert scenario.actions == ()
    assert scenario.checks == ()


def test_phases_follow_each_other_and_inherit_the_workload_defaults(tmp_path: Path) -> None:
    text = """\
fleet: {file: FLEET, emulated: false}
strategy: {name: round-robin}
workload:
  lengths: {lognormal: {prompt: [200, 400], output: [100, 150]}}
  priorities: {high: 1, low: 3}
  phases:
    - {duration: 10, load: 0.5}
    - {duration: 5, rate: 20, arrivals: gamma, burstiness: 0.5, lengths: {trace: code}}
actions:
  - {at: 8, command: weight, replica: v100-0, weight: 0.5}
  - {at: 2, fault: slow, replica: a100-0, factor: 2}
"""
    s = load_scenario(scenario_file(tmp_path, text))
    first, second = s.phases
    assert (first.start_s, second.start_s, s.duration_s) == (0.0, 10.0, 15.0)
    assert first.lengths.lognormal == ((200.0, 400.0), (100.0, 150.0))
    assert dict(first.priorities) == {Priority.HIGH: 0.25, Priority.LOW: 0.75}
    assert second.lengths == Lengths(trace="code")
    assert (second.arrivals, second.burstiness) == ("gamma", 0.5)
    assert s.strategy == "round-robin"
    assert not s.fleet.emulated
    # Actions come in time order, whatever the file's order.
    assert [a.at_s for a in s.actions] == [2.0, 8.0]
    assert s.actions[0].describe() == "slow a100-0 x2"


def test_an_unknown_key_is_named_with_its_line_and_a_suggestion(tmp_path: Path) -> None:
    assert problems(GOOD + "chekcs: []\n", tmp_path) == [
        "5: chekcs: unknown key 'chekcs'; did you mean 'checks'?"
    ]


def test_every_problem_in_the_file_is_reported_at_once(tmp_path: Path) -> None:
    text = """\
fleet: FLEET
workload:
  phases:
    - {duration: 10, rate: 5, load: 0.5}
    - {duration: -1, rate: 5}
actions:
  - {at: 3, command: drain, replica: a100_0}
  - {at: 4, command: dance, replica: a100-0}
  - {at: 5, fault: slow, replica: a100-0}
  - {at: 6, command: strategy, name: round-robbin}
  - {at: 99, command: drain, replica: a100-0}
checks:
  - {metric: imbalance, max: 2}
  - {metric: ttft_p99_s, from: 30, to: 20, max: 2}
  - {metric: state, replica: a100-0, equals: gone, at: 3}
  - {metric: lost}
  - {metric: lost, max: 0, priority: high}
"""
    found = problems(text, tmp_path)
    assert found == [
        "4: workload.phases[0]: give exactly one of rate (requests/s) or load (x capacity_rps)",
        "5: workload.phases[1].duration: must be > 0, got -1",
        "7: actions[0].replica: unknown replica 'a100_0'; did you mean 'a100-0'?",
        "8: actions[1]: unknown command 'dance'; known: strategy, weight, batch, drain, "
        "undrain, preempt, eject, readmit, split, unsplit",
        "9: actions[2].factor: slow needs a factor (> 0)",
        "10: actions[3].name: unknown strategy 'round-robbin'; known: affinity, capacity-aware, "
        "least-connections, least-outstanding-tokens, p2c-peak-ewma, random, round-robin, "
        "shortest-expected-delay, tiered, weighted-least-connections, weighted-random, "
        "weighted-round-robin",
        "13: checks[0].metric: unknown metric 'imbalance'; did you mean 'imbalance_factor'?",
        "14: checks[1].to: must be after from (30)",
        "15: checks[2].equals: unknown equals 'gone'; expected one of: active, draining, "
        "drained, ejected",
        "16: checks[3]: give min, max or both",
        "17: checks[4].priority: does not apply to metric 'lost'",
    ]


def test_an_action_after_the_workload_ends_is_refused(tmp_path: Path) -> None:
    text = GOOD + "actions:\n  - {at: 11, command: drain, replica: a100-0}\n"
    assert problems(text, tmp_path) == ["6: actions[0].at: is after the workload ends (10 s)"]


def test_a_missing_fleet_file_is_named_from_the_scenario(tmp_path: Path) -> None:
    text = "fleet: nowhere.yaml\nworkload: {phases: [{duration: 1, rate: 1}]}\n"
    (problem,) = problems(text, tmp_path)
    assert problem.startswith("1: fleet: no such file: ")
    assert problem.endswith("nowhere.yaml (relative paths start at the scenario file)")


def test_the_fleet_files_own_problems_name_the_fleet_file(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes: []\nbogus: 1\n")
    path = scenario_file(
        tmp_path, "fleet: fleet.yaml\nworkload: {phases: [{duration: 1, rate: 1}]}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert {p.file for p in info.value.problems} == {str(fleet)}


def test_yaml_that_does_not_parse_names_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario("fleet: x\nworkload: [\n", "bad.yaml")
    (problem,) = info.value.problems
    assert (problem.file, problem.key) == ("bad.yaml", "<file>")
    assert problem.line is not None


def test_a_bad_scenario_exits_2_with_file_line_and_key(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, GOOD + "checks:\n  - {metric: lost, max: zero}\n")
    run = run_cli(str(path), "--simulate")
    assert run.code == 2
    assert run.out == ""
    assert (
        run.err == f"gpurouter run: {path}:6: checks[0].max: expected a number, got string 'zero'\n"
    )


def test_faults_on_real_endpoints_are_refused_before_anything_starts(tmp_path: Path) -> None:
    text = GOOD.replace("fleet: FLEET", "fleet: {file: FLEET, emulated: false}")
    path = scenario_file(tmp_path, text + "actions:\n  - {at: 1, fault: kill, replica: a100-0}\n")
    run = run_cli(str(path))
    assert run.code == 2
    assert (
        run.err
        == f"gpurouter run: {path}:6: actions[0].fault: faults need an emulated fleet live\n"
    )
