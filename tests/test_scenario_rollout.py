"""A scenario's rollout step: read and checked at load, run on the simulator, and run live
against a small emulated fleet, where its checks hold (nothing lost, capacity kept above the
floor, every replica on the new version, the rollout done)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.errors import ConfigError
from router.scenario import load_scenario
from router.scenario.rollout_step import EmulatorUpdater
from router.scenario.runner_live import run_live
from tests.scenario_helpers import EXAMPLES, run_cli, scenario_file

SMALL_FLEET = """\
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: n0
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: A100-80GB, memory_gib: 80}
      - {index: 2, model: V100-32GB, memory_gib: 32}
      - {index: 3, model: V100-32GB, memory_gib: 32}
    replicas:
      - {id: a0, endpoint: "http://127.0.0.1:1", gpus: [0], weight: 2.2}
      - {id: a1, endpoint: "http://127.0.0.1:1", gpus: [1], weight: 2.2}
      - {id: v0, endpoint: "http://127.0.0.1:1", gpus: [2], weight: 1.0}
      - {id: v1, endpoint: "http://127.0.0.1:1", gpus: [3], weight: 1.0}
"""

# Ten times faster than life: 40 emulated seconds of light load take 4 s of wall time.
LIVE_ROLLOUT = """\
name: live-rollout
seed: 3
fleet: {file: small-fleet.yaml, time_scale: 10}
workload:
  lengths: {lognormal: {prompt: [200, 300], output: [40, 60]}}
  phases:
    - {duration: 40, rate: 4}
# Long enough for a starved machine to finish the rollout and answer every request; the run
# ends as soon as both are done, so a machine that keeps up is not kept longer.
drain: 300
actions:
  - at: 3
    rollout:
      {version: llama-v2, floor: 0.6, check_interval_s: 0.5, updater: {emulator: {load_s: 2}}}
checks:
  - {metric: rollout_phase, equals: done}
  - {metric: rollout_capacity_lowest, min: 0.6}
  - {metric: rollout_behind, max: 0}
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
    rollout: STEP
"""


def test_the_example_loads_with_its_rollout_step() -> None:
    scenario = load_scenario(EXAMPLES / "rollout-mixed.yaml")
    (action,) = scenario.actions
    assert action.at_s == 20
    step = action.rollout
    assert step is not None
    assert step.version == "llama-3.1-8b-v2"
    assert step.settings["floor"] == 0.75
    assert step.settings["order"] == "weakest-first"
    assert step.emulator == EmulatorUpdater(load_s=5.0)
    metrics = {c.metric for c in scenario.checks}
    assert {"rollout_phase", "rollout_capacity_lowest", "rollout_behind", "lost"} <= metrics


def test_the_emulator_updater_becomes_the_version_switch_over_http() -> None:
    step = load_scenario(EXAMPLES / "rollout-mixed.yaml").actions[0].rollout
    assert step is not None
    settings = step.live_settings("http://127.0.0.1:9", "m", 10.0)
    assert settings["drain_timeout_s"] == 6.0  # scenario seconds, ten times faster
    assert settings["updater"] == {
        "http": {
            "url": "http://127.0.0.1:9/versions/{replica}",
            "body": '{"version": "{version}", "aliases": ["m"], "load_s": 5.0}',
            "expect_status": 202,
        }
    }


def _problems(tmp_path: Path, text: str) -> list[tuple[int | None, str, str]]:
    path = scenario_file(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert all(p.file == str(path) for p in caught.value.problems)
    return [(p.line, p.key, p.message) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("step", "key", "words"),
    [
        ("{version: v2, flor: 0.75, updater: emulator}", "actions[0].rollout.flor", "'floor'"),
        ("{version: 'bad version!', updater: emulator}", "actions[0].rollout.version", "org/"),
        ("{floor: 0.75, updater: emulator}", "actions[0].rollout.version", "missing"),
        ("{version: v2, floor: 0.9, updater: emulator}", "actions[0].rollout.floor", "of 90%"),
        ("{version: v2, floor: 1.5, updater: emulator}", "actions[0].rollout.floor", "1"),
        ("{version: v2, order: newest, updater: emulator}", "actions[0].rollout.order", "newest"),
        ("{version: v2}", "actions[0].rollout.updater", "no updater"),
        (
            "{version: v2, updater: {emulator: {load_s: -1}}}",
            "actions[0].rollout.updater.emulator.load_s",
            ">= 0",
        ),
    ],
)
def test_a_bad_rollout_step_is_refused_with_its_line_and_key(
    tmp_path: Path, step: str, key: str, words: str
) -> None:
    problems = _problems(tmp_path, BASE.replace("STEP", step))
    assert [(line, k) for line, k, _ in problems] == [(7, key)], problems
    assert words in problems[0][2]


def test_the_emulator_updater_needs_an_emulated_fleet(tmp_path: Path) -> None:
    text = BASE.replace("STEP", "{version: v2, updater: emulator}")
    text = text.replace("fleet: FLEET", "fleet: {file: FLEET, emulated: false}")
    ((line, key, message),) = _problems(tmp_path, text)
    assert (line, key) == (7, "actions[0].rollout.updater")
    assert "emulated" in message


def test_one_rollout_per_scenario_and_its_checks_need_one(tmp_path: Path) -> None:
    two = BASE.replace("STEP", "{version: v2, updater: emulator}") + (
        "  - {at: 9, rollout: {version: v3, updater: emulator}}\n"
    )
    assert [(line, key) for line, key, _ in _problems(tmp_path, two)] == [(8, "actions[1].rollout")]
    none = "fleet: FLEET\nworkload: {phases: [{duration: 5, rate: 1}]}\n" + (
        "checks:\n  - {metric: rollout_behind, max: 0}\n"
    )
    ((line, key, message),) = _problems(tmp_path, none)
    assert (line, key) == (4, "checks[0].metric")
    assert "needs a rollout action" in message


def test_the_mixed_rollout_runs_on_the_simulator_with_the_checks_of_a_live_run() -> None:
    """``--simulate`` runs the example's rollout step: the same checks hold, and the summary
    carries what the rollout cost the traffic, window by window."""
    run = run_cli(str(EXAMPLES / "rollout-mixed.yaml"), "--simulate", "--json")
    assert run.code == 0, run.err
    summary = json.loads(run.out.splitlines()[-1])
    assert summary["passed"] is True
    rollout = summary["rollout"]
    assert rollout["phase"] == "done"
    assert rollout["behind"] == []
    assert rollout["capacity_lowest"] >= 0.75
    traffic = rollout["traffic"]
    assert set(traffic["ttft_p99_s"]) == {"before", "during", "after"}
    assert traffic["lost"] == {"before": 0, "during": 0, "after": 0}
    assert traffic["peak_queue"] >= 0
    assert traffic["requests"] > 0


def test_the_text_summary_of_a_simulated_rollout_has_its_traffic_line() -> None:
    run = run_cli(str(EXAMPLES / "rollout-mixed.yaml"), "--simulate")
    assert run.code == 0, run.err
    (line,) = [row for row in run.out.splitlines() if row.startswith("  rollout done in ")]
    assert "capacity at lowest 75." in line
    assert "p99 TTFT before/during/after " in line
    assert line.endswith("lost 0")


async def test_a_rollout_runs_live_and_its_checks_hold(tmp_path: Path) -> None:
    (tmp_path / "small-fleet.yaml").write_text(SMALL_FLEET, encoding="utf-8")
    path = tmp_path / "live-rollout.yaml"
    path.write_text(LIVE_ROLLOUT, encoding="utf-8")
    lines: list[dict[str, Any]] = []
    report = await run_live(load_scenario(path), lines.append)
    # Every check holds; whether this machine kept up is its own verdict, not this test's.
    assert not report.failed, [str(c) for c in report.failed]
    (action,) = [line for line in lines if line["kind"] == "action"]
    assert action["ok"] is True
    assert action["message"].startswith("rollout-")
    summary = report.summary()
    rollout = summary["rollout"]
    assert rollout["phase"] == "done"
    assert rollout["behind"] == []
    assert rollout["error"] is None
    assert sorted(r for wave in rollout["waves"] for r in wave) == ["a0", "a1", "v0", "v1"]
    assert rollout["capacity_lowest"] >= 0.6
    # Every request the client sent got an HTTP answer, and each completed.
    assert summary["lost"] == 0
    assert summary["client"] == {"completed": summary["offered"]}
