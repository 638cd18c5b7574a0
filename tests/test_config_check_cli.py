"""`gpurouter config check` and `gpurouter strategies`: what they print and how they exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from console.cli import main
from router.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "fleets"

BROKEN = """\
model: m
nodes:
  - name: n0
    gpus: [{index: 0, model: A100-80GB, memory_gib: 80}]
    replicas:
      - {id: r0, endpoint: "http://127.0.0.1:18001", gpus: [0], wieght: 2}
      - {id: r0, endpoint: "http://127.0.0.1:18002", gpus: [3], batch_size: 0}
router:
  strategy: {name: fastest}
"""


@pytest.mark.parametrize(
    ("name", "summary"),
    [
        ("mixed-a100-v100.yaml", "ok: 2 nodes, 8 GPUs, 8 replicas"),
        ("h100-a100-l4.yaml", "ok: 3 nodes, 8 GPUs, 8 replicas"),
        ("tensor-parallel-70b.yaml", "ok: 3 nodes, 12 GPUs, 6 replicas"),
    ],
)
def test_check_prints_a_summary_and_exits_0_for_a_good_file(
    name: str, summary: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "check", str(EXAMPLES / name)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"{summary}\n", "")


def test_check_prints_every_problem_then_a_count_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    assert main(["config", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:6: nodes[0].replicas[0].wieght: unknown key 'wieght'; did you mean 'weight'?",
        f"{path}:7: nodes[0].replicas[1].batch_size: must be >= 1, got 0",
        f"{path}:7: nodes[0].replicas[1].gpus[0]: GPU 3 is not one of the node's GPUs (0)",
        f"{path}:7: nodes[0].replicas[1].id: duplicate replica id 'r0' (first at line 6)",
        f"{path}:9: router.strategy.name: unknown strategy 'fastest'; expected one of: "
        + ", ".join(sorted(STRATEGIES)),
        f"5 problem(s) in {path}",
    ]


def test_check_notes_each_replica_kind_without_a_profile_and_still_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model gpurouter cannot model is fine for routing: a note on stdout, not a problem."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "model: my-org/custom-7b\n"
        "nodes:\n"
        "  - name: n0\n"
        "    gpus:\n"
        "      - {index: 0, model: A100-80GB, memory_gib: 80}\n"
        "      - {index: 1, model: A100-80GB, memory_gib: 80}\n"
        "      - {index: 2, model: MI300X, memory_gib: 192}\n"
        "    replicas:\n"
        "      - {id: r0, endpoint: 'http://127.0.0.1:18001', gpus: [0]}\n"
        "      - {id: r1, endpoint: 'http://127.0.0.1:18002', gpus: [1]}\n"
        "      - {id: r2, endpoint: 'http://127.0.0.1:18003', gpus: [2],"
        " model: meta-llama/Llama-3.1-8B}\n"
    )
    assert main(["config", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "ok: 1 nodes, 3 GPUs, 3 replicas",
        "note: no performance profile for my-org/custom-7b on A100-80GB; "
        "the emulator and simulator cannot model it",
        "note: no performance profile for meta-llama/Llama-3.1-8B on MI300X; "
        "the emulator and simulator cannot model it",
    ]


def test_check_catches_parameters_the_strategy_does_not_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(
        "model: meta-llama/Llama-3.1-8B\n"
        "nodes:\n"
        "  - name: n0\n"
        "    gpus: [{index: 0, model: A100-80GB, memory_gib: 80}]\n"
        "    replicas: [{id: r0, endpoint: 'http://127.0.0.1:18001', gpus: [0]}]\n"
        "router:\n"
        "  strategy:\n"
        "    name: round-robin\n"
        "    params: {foo: 1}\n"
    )
    assert main(["config", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:9: router.strategy.params: round-robin takes no parameter 'foo'",
        f"1 problem(s) in {path}",
    ]


def test_check_reports_a_problem_in_a_profile_file_the_fleet_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.yaml").write_text("gpus:\n  X1: {fp16_tflops: 1, bf16: true}\n")
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "model: meta-llama/Llama-3.1-8B\n"
        "profiles: [mine.yaml]\n"
        "nodes:\n"
        "  - name: n0\n"
        "    gpus: [{index: 0, model: X1, memory_gib: 80}]\n"
        "    replicas: [{id: r0, endpoint: 'http://127.0.0.1:18001', gpus: [0]}]\n"
    )
    assert main(["config", "check", str(path)]) == 2
    mine = tmp_path / "mine.yaml"
    assert capsys.readouterr().err.splitlines() == [
        f"{mine}:2: gpus.X1.bandwidth_gbs: missing",
        f"{mine}:2: gpus.X1.memory_mib: missing",
        f"2 problem(s) in {path}",
    ]


def test_check_of_a_missing_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absent.yaml"
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}: <file>: cannot read: No such file or directory",
        f"1 problem(s) in {path}",
    ]


def test_check_runs_as_a_module_in_its_own_process() -> None:
    """`python -m console.cli config check FILE` works as installed scripts will call it."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli",
            "config",
            "check",
            "examples/fleets/mixed-a100-v100.yaml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "ok: 2 nodes, 8 GPUs, 8 replicas\n",
        "",
    )


def test_strategies_lists_every_strategy_in_aligned_columns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["strategies"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "SUMMARY"]
    column = header.index("SUMMARY")
    assert [row[:column].strip() for row in rows] == list(STRATEGIES)
    assert [row[column:] for row in rows] == [cls.summary for cls in STRATEGIES.values()]


SCENARIO = """\
name: drill
seed: 3
fleet: {fleet}
workload:
  phases:
    - {{duration: 20, load: 0.5}}
actions:
  - {{at: 5, command: drain, replica: r0}}
checks:
  - {{metric: failed, max: 0}}
"""


def test_check_of_a_scenario_file_says_so_and_checks_it_with_its_fleet(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A scenario is not a fleet file with ten unknown keys: it is named as what it is."""
    fleet = EXAMPLES / "mixed-a100-v100.yaml"
    path = tmp_path / "drill.yaml"
    path.write_text(SCENARIO.format(fleet=fleet).replace("r0", "a100-0"))
    assert main(["config", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        f"{path} is a scenario file (gpurouter run); checking it as one",
        "ok: scenario drill: 20 s in 1 phase(s), 1 action(s), 1 check(s); "
        f"fleet {fleet}: 2 nodes, 8 GPUs, 8 replicas",
    ]


def test_check_of_a_broken_scenario_lists_the_scenarios_problems_not_fleet_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "drill.yaml"
    path.write_text(SCENARIO.format(fleet=EXAMPLES / "mixed-a100-v100.yaml"))
    assert main(["config", "check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == f"{path} is a scenario file (gpurouter run); checking it as one\n"
    assert "did you mean 'server'" not in err
    assert err.splitlines() == [
        f"{path}:8: actions[0].replica: unknown replica 'r0'; expected one of: a100-0, a100-1, "
        "a100-2, a100-3, v100-0, v100-1, v100-2, v100-3",
        f"1 problem(s) in {path}",
    ]
