"""Where a workload's ``max_tokens`` is set: ``gpurouter sim --max-tokens`` and scenario files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.cli import main
from router.errors import ConfigError
from router.scenario import load_scenario
from router.scenario.workload import Workload
from tests.scenario_helpers import MIXED, run_cli, scenario_file


def test_scenario_max_tokens_is_a_workload_default_a_phase_may_override(tmp_path: Path) -> None:
    text = """\
fleet: FLEET
workload:
  max_tokens: 1024
  phases:
    - {duration: 10, rate: 5}
    - {duration: 10, rate: 5, max_tokens: 256}
"""
    first, second = load_scenario(scenario_file(tmp_path, text)).phases
    assert (first.max_tokens, second.max_tokens) == (1024, 256)


def test_without_max_tokens_a_scenario_keeps_each_requests_own_length(tmp_path: Path) -> None:
    text = "fleet: FLEET\nworkload:\n  phases:\n    - {duration: 10, rate: 5}\n"
    scenario = load_scenario(scenario_file(tmp_path, text))
    assert scenario.phases[0].max_tokens is None
    shots = list(Workload(scenario).shots())
    assert shots
    assert all(s.max_tokens == s.output_tokens for s in shots)


def test_a_scenarios_shots_carry_the_cap_and_their_own_lengths(tmp_path: Path) -> None:
    text = "fleet: FLEET\nworkload:\n  max_tokens: 64\n  phases:\n    - {duration: 10, rate: 20}\n"
    shots = list(Workload(load_scenario(scenario_file(tmp_path, text))).shots())
    assert {s.max_tokens for s in shots} == {64}
    lengths = [s.output_tokens for s in shots]
    assert all(o is not None and o <= 64 for o in lengths)
    assert len(set(lengths)) > 1


def test_a_max_tokens_below_1_or_not_an_integer_is_a_problem_with_its_line(
    tmp_path: Path,
) -> None:
    text = """\
fleet: FLEET
workload:
  max_tokens: 0
  phases:
    - {duration: 10, rate: 5, max_tokens: lots}
"""
    with pytest.raises(ConfigError) as info:
        load_scenario(scenario_file(tmp_path, text))
    assert [f"{p.line}: {p.key}: {p.message}" for p in info.value.problems] == [
        "3: workload.max_tokens: must be >= 1, got 0",
        "5: workload.phases[0].max_tokens: expected an integer, got string 'lots'",
    ]


def test_a_simulated_scenario_runs_with_a_cap(tmp_path: Path) -> None:
    text = """\
fleet: FLEET
workload:
  max_tokens: 1024
  phases:
    - {duration: 10, load: 0.3}
"""
    run = run_cli(str(scenario_file(tmp_path, text)), "--simulate", "--json")
    assert run.code == 0, run.err
    assert run.summary["lost"] == 0


def _sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["sim", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_sim_max_tokens_flag_sends_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-tokens`` runs: the same arrivals, the router told a larger max_tokens."""
    common = ["--fleet", str(MIXED), "--strategy", "least-outstanding-tokens", "--json"]
    common += ["--duration", "30", "--load", "0.5"]
    code, out, err = _sim(capsys, *common)
    assert code == 0, err
    code, capped_out, err = _sim(capsys, *common, "--max-tokens", "1024")
    assert code == 0, err
    own, capped = json.loads(out), json.loads(capped_out)
    # conv's answers are all under 1024 tokens: the engines write the same, so the fleet's
    # capacity is the same; only what the router knows of each request changed.
    assert capped["capacity_rps"] == own["capacity_rps"]
    assert capped["lost_requests"] == 0


def test_sim_refuses_a_max_tokens_below_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _sim(capsys, "--fleet", str(MIXED), "--max-tokens", "0")
    assert code == 2
    assert "--max-tokens must be >= 1, got 0" in err
