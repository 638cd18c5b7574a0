"""A scenario's canary step: read and checked at load, run on the simulator (the example, whose
new version is made to fail once in service) and live against a small emulated fleet whose new
version is made to fail by a fault set for that version; both ways the canary rolls itself
back and its checks hold (nothing lost, the split back at 0, every replica on the old
version)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.config.schema import CanaryConfig
from router.errors import ConfigError
from router.scenario import load_scenario
from router.scenario.runner_live import run_live
from tests.scenario_helpers import EXAMPLES, run_cli, scenario_file
from tests.test_scenario_examples import simulated
from tests.test_scenario_rollout import SMALL_FLEET

# Ten times faster than life: 60 emulated seconds of light load take 6 s of wall time.
LIVE_CANARY = """\
name: live-canary
seed: 3
fleet: {file: small-fleet.yaml, time_scale: 10}
workload:
  lengths: {lognormal: {prompt: [200, 300], output: [40, 60]}}
  phases:
    - {duration: 60, rate: 6}
# Long enough for a starved machine to finish the canary and answer every request; the run
# ends as soon as both are done, so a machine that keeps up is not kept longer.
drain: 300
actions:
  - at: 3
    canary:
      version: llama-v2
      replicas: [v0]
      # TTFT left out of the verdict (a V100 canary beside A100s on a busy test machine):
      # the failures decide.
      canary: {steps: [50, 100], dwell_s: 100, window_s: 60, min_requests: 8, max_ttft_ratio: 100}
      floor: 0.6
      check_interval_s: 0.5
      updater: {emulator: {load_s: 2}}
  # Late enough for the judge's minimum of healthy requests first: in service again at about
  # 6 s, v0 warms up from one slot (router.slow_start_s, in wall seconds, is 300 emulated s
  # here) and the new version's requests it has no slot for go to the old one, and five
  # failures in a row eject it, after which it gets none to judge.
  - {at: 25, fault: fail_fraction, replica: v0, fraction: 1.0, version: llama-v2}
checks:
  - {metric: canary_phase, equals: rolled back}
  - {metric: canary_share, max: 0}
  - {metric: canary_on_new, max: 0}
  - {metric: lost, max: 0}
  - {metric: failed, max: 0}
"""

BASE = """\
fleet: FLEET
workload:
  phases:
    - {duration: 30, load: 0.5}
actions:
  - at: 5
    canary: STEP
"""


def test_the_example_loads_with_its_canary_step_and_version_fault() -> None:
    scenario = load_scenario(EXAMPLES / "canary-failing.yaml")
    canary, fault = scenario.actions
    assert canary.canary is not None
    assert canary.canary.version == "llama-3.1-8b-v2"
    assert canary.canary.replicas == ("v100-0",)
    assert fault.version == "llama-3.1-8b-v2"
    assert {c.metric for c in scenario.checks} >= {"canary_phase", "canary_share", "lost"}


def test_a_live_canary_body_is_in_wall_seconds_with_the_fleet_files_rules_filled() -> None:
    step = load_scenario(EXAMPLES / "canary-failing.yaml").actions[0].canary
    assert step is not None
    body = step.live_body("http://127.0.0.1:9", "m", 10.0, CanaryConfig(check_interval_s=2.0))
    rules = body["settings"]["canary"]
    assert (rules["dwell_s"], rules["window_s"], rules["check_interval_s"]) == (4.0, 2.0, 0.2)
    assert rules["steps"] == [10.0, 25.0, 50.0, 100.0]
    assert body["replicas"] == ["v100-0"]
    assert body["settings"]["updater"]["http"]["url"] == "http://127.0.0.1:9/versions/{replica}"


def _problems(tmp_path: Path, text: str) -> list[tuple[int | None, str, str]]:
    path = scenario_file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    return [(p.line, p.key, p.message) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("step", "key", "words"),
    [
        ("{version: v2, updater: emulator}", "actions[0].canary.replicas", "missing"),
        ("{version: v2, replicas: [x9], updater: emulator}", "actions[0].canary.replicas", "x9"),
        (
            "{version: v2, replicas: [a100-0], canary: {steps: [50, 5]}, updater: emulator}",
            "actions[0].canary.canary.steps",
            "above the one before",
        ),
        (
            "{version: v2, replicas: [a100-0], manual: 3, updater: emulator}",
            "actions[0].canary.manual",
            "true or false",
        ),
        ("{version: v2, replicas: [a100-0], stepz: 1}", "actions[0].canary.stepz", "unknown key"),
    ],
)
def test_a_bad_canary_step_is_refused_with_its_line_and_key(
    tmp_path: Path, step: str, key: str, words: str
) -> None:
    problems = _problems(tmp_path, BASE.replace("STEP", step))
    assert (7, key) in [(line, k) for line, k, _ in problems], problems
    assert any(words in message for _, k, message in problems if k == key)


def test_a_version_fault_is_only_for_slow_and_fail_fraction(tmp_path: Path) -> None:
    text = "fleet: FLEET\nworkload: {phases: [{duration: 9, rate: 1}]}\n" + (
        "actions:\n  - {at: 5, fault: kill, replica: a100-0, version: v2}\n"
    )
    problems = _problems(tmp_path, text)
    assert [(line, k) for line, k, _ in problems] == [(4, "actions[0].version")], problems
    assert "only slow and fail_fraction" in problems[0][2]


def test_canary_checks_need_a_canary_action(tmp_path: Path) -> None:
    none = "fleet: FLEET\nworkload: {phases: [{duration: 5, rate: 1}]}\n" + (
        "checks:\n  - {metric: canary_share, max: 0}\n"
    )
    ((line, key, message),) = _problems(tmp_path, none)
    assert (line, key) == (4, "checks[0].metric")
    assert "needs a canary action" in message


def test_the_failing_canary_example_rolls_itself_back_on_the_simulator() -> None:
    """``gpurouter run --simulate examples/scenarios/canary-failing.yaml``: the judge, fed by
    the simulated requests, puts the split back at 0% on its own once the new version fails
    (the fault at 45 s), naming the worse error rate with both versions' figures; the V100 is
    moved back to the old version, and no request is lost or failed."""
    run = simulated(EXAMPLES / "canary-failing.yaml")
    assert run.code == 0, run.err
    summary = run.summary
    assert summary["passed"] is True
    assert (summary["lost"], summary["failed"]) == (0, 0)
    assert summary["completed"] == summary["offered"]
    actions = [line for line in run.lines if line["kind"] == "action"]
    assert [a["ok"] for a in actions] == [True, True]  # the canary and the fault, nothing else
    canary = summary["canary"]
    assert canary["phase"] == "rolled back"
    assert (canary["share"], canary["on_new"]) == (0.0, [])
    # Decided by the judge after the fault, not by an operator.
    assert 45.0 < canary["rolled_back_at"] < canary["ended_at"]
    assert canary["verdict"].startswith("error rate worse by more than 5% points")
    comment = (EXAMPLES / "canary-failing.yaml").read_text(encoding="utf-8").split("\nname:")[0]
    assert f"back to 0% at {canary['rolled_back_at']:.1f} s" in comment
    new, old = canary["judged"]["new"], canary["judged"]["old"]
    assert new["errors"] > 0
    assert new["requests"] >= 20
    assert old["requests"] >= 20
    assert new["error_rate"] - old["error_rate"] > 0.05
    # The failed attempts were retried on the old version: the clients saw none of them.
    assert all(check["ok"] for check in summary["checks"])


def test_the_text_summary_of_a_simulated_canary_says_when_and_why_it_rolled_back() -> None:
    run = run_cli(str(EXAMPLES / "canary-failing.yaml"), "--simulate")
    assert run.code == 0, run.err
    assert "  canary rolled back: started at 10.0 s, back to 0% at 45.9 s" in run.out
    assert "  error rate worse by more than 5% points: llama-3.1-8b-v2 error rate" in run.out


async def test_a_failing_canary_rolls_itself_back_live_and_its_checks_hold(tmp_path: Path) -> None:
    (tmp_path / "small-fleet.yaml").write_text(SMALL_FLEET, encoding="utf-8")
    path = tmp_path / "live-canary.yaml"
    path.write_text(LIVE_CANARY, encoding="utf-8")
    lines: list[dict[str, Any]] = []
    report = await run_live(load_scenario(path), lines.append)
    assert not report.failed, [str(c) for c in report.failed]
    actions = [line for line in lines if line["kind"] == "action"]
    assert [a["ok"] for a in actions] == [True, True]
    canary = report.summary()["canary"]
    assert canary["phase"] == "rolled back"
    assert canary["on_new"] == []
    assert canary["judged"]["new"]["errors"] > 0  # the figures the rollback was decided on
    assert canary["verdict"].startswith("error rate")
    assert report.summary()["lost"] == 0
