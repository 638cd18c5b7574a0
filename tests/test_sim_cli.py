"""`gpurouter sim`: the fields it prints, its table, its search, and how it refuses bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from console.cli import main
from router.strategies import STRATEGIES
from tests.fleet_factory import TWO_CARD_YAML

MIXED = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "mixed-a100-v100.yaml"

# Every field issue 7 asks `gpurouter sim --json` to print, per strategy.
FIELDS = {
    "strategy",
    "offered_rps",
    "throughput_rps",
    "output_tokens_per_s",
    "capacity_rps",
    "capacity_fraction",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "imbalance_factor",
    "utilization_by_gpu_model",
    "lost_requests",
}

ONE_GPU_FLEET = """\
model: meta-llama/Llama-3.1-8B-Instruct
profiles: [cards.yaml]
nodes:
  - name: n0
    gpus: [{{index: 0, model: {gpu}, memory_gib: 80}}]
    replicas:
      - {{id: r0, endpoint: "http://127.0.0.1:18001", gpus: [0]}}
"""

# A card no built-in profile knows, with an A100-80GB's figures but twice its bandwidth.
CARDS = """\
gpus:
  X-100:
    fp16_tflops: 312
    bf16: true
    bandwidth_gbs: 4078
    memory_mib: 81920
"""


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's layout follows $COLUMNS when stdout is not a terminal: none unless a test
    sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def small_fleet(tmp_path: Path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(TWO_CARD_YAML)
    return str(path)


def sim(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["sim", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_prints_one_object_per_strategy_with_every_field_the_issue_lists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = sim(
        capsys, "--fleet", str(MIXED), "--load", "0.5", "--duration", "30", "--seed", "3", "--json"
    )
    assert (code, err) == (0, "")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["strategy"] for r in rows] == sorted(STRATEGIES)
    for r in rows:
        assert r.keys() >= FIELDS
        assert r["lost_requests"] == 0
        assert r["capacity_fraction"] == pytest.approx(
            r["throughput_rps"] / r["capacity_rps"], 1e-3
        )
        assert r["offered_rps"] == pytest.approx(0.5 * r["capacity_rps"], 1e-3)
        assert set(r["utilization_by_gpu_model"]) == {"A100-80GB", "V100-32GB"}
        assert r["imbalance_factor"] >= 1.0
        assert r["ttft_p50_s"] <= r["ttft_p99_s"]
        assert r["e2e_p50_s"] <= r["e2e_p99_s"]


def test_without_json_it_prints_a_table_with_every_strategy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = sim(capsys, "--fleet", str(MIXED), "--rate", "10", "--duration", "20")
    assert code == 0
    assert "capacity_rps =" in out
    assert "ttft_p99_s" in out
    for name in STRATEGIES:
        assert name in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_max_sustainable_prints_the_rate_its_fraction_and_the_run_at_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = sim(
        capsys,
        "--fleet",
        str(MIXED),
        "--strategy",
        "weighted-least-connections",
        "--max-sustainable",
        "--search-steps",
        "2",
        # A 24 s steady window holds less than one 20-40 s conversation's life: whether it
        # keeps up at 0.3 turned on which few requests finished inside it.
        "--duration",
        "60",
        "--json",
    )
    assert code == 0
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["strategy"] == "weighted-least-connections"
    assert row["slo_ttft_p99_s"] == 2.0
    # Two halvings of 0..1.2 can only land on 0, 0.3, 0.6 or 0.9 of capacity.
    assert row["max_sustainable_fraction"] in (0.0, 0.3, 0.6, 0.9)
    assert row["max_sustainable_rps"] == pytest.approx(
        row["max_sustainable_fraction"] * row["capacity_rps"], 1e-3
    )
    assert row["at_max"] is not None
    assert row["at_max"].keys() >= FIELDS
    assert row["at_max"]["ttft_p99_s"] <= 2.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "fastest"], "unknown strategy 'fastest'; known: all, affinity"),
        (["--rate", "0"], "--rate must be > 0, got 0.0"),
        (["--load", "-1"], "--load must be > 0, got -1.0"),
        (["--duration", "0"], "--duration must be > 0, got 0.0"),
        (["--search-steps", "0"], "--search-steps must be >= 1, got 0"),
        (["--arrivals", "trace", "--lengths", "lognormal"], "brings its own lengths"),
        (["--trace", "no-such-trace.csv"], "no-such-trace.csv: trace: cannot read"),
    ],
)
def test_bad_arguments_are_one_line_on_stderr_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = sim(capsys, "--fleet", str(MIXED), *args)
    assert (code, out) == (2, "")
    assert err.startswith("gpurouter sim: ")
    assert message in err
    assert err.count("\n") == 1


def test_a_model_that_does_not_fit_a_card_is_refused_with_what_it_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "t4.yaml"
    fleet.write_text(ONE_GPU_FLEET.format(gpu="T4").replace("profiles: [cards.yaml]\n", ""))
    code, out, err = sim(capsys, "--fleet", str(fleet))
    assert (code, out) == (2, "")
    assert "does not fit 1 x T4" in err
    assert "tensor_parallel >= 2" in err


def test_the_fleet_files_own_gpu_profiles_drive_the_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A card known only from the fleet's `profiles:` file simulates, and more bandwidth than
    an A100-80GB's buys more capacity on the same workload."""
    (tmp_path / "cards.yaml").write_text(CARDS)
    capacity = {}
    for gpu in ("X-100", "A100-80GB"):
        fleet = tmp_path / f"{gpu}.yaml"
        fleet.write_text(ONE_GPU_FLEET.format(gpu=gpu))
        code, out, err = sim(
            capsys, "--fleet", str(fleet), "--strategy", "round-robin", "--rate", "1",
            "--duration", "20", "--json",
        )  # fmt: skip
        assert (code, err) == (0, "")
        capacity[gpu] = json.loads(out)["capacity_rps"]
    assert capacity["X-100"] > capacity["A100-80GB"]


def table_rows(out: str) -> list[str]:
    """The strategy names of a table's rows, top to bottom."""
    names = sorted(STRATEGIES, key=len, reverse=True)
    return [
        next(n for n in names if n in line)
        for line in out.splitlines()
        if line.startswith("  ") and any(n in line for n in names)
    ]


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["strategy"]: r for r in rows}


def expected_order(rows: list[dict[str, Any]]) -> list[str]:
    """Lowest p99 TTFT first (unbounded last), then the most served, then the name."""
    return [
        r["strategy"]
        for r in sorted(
            rows,
            key=lambda r: (
                float("inf") if r["ttft_p99_s"] is None else r["ttft_p99_s"],
                -r["throughput_rps"],
                r["strategy"],
            ),
        )
    ]


def test_the_rows_are_the_same_on_one_process_or_several(
    small_fleet: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Strategies run in parallel processes give the serial run's rows, in the same order."""
    args = ("--fleet", small_fleet, "--load", "0.7", "--duration", "10", "--json")
    serial = sim(capsys, *args, "--jobs", "1")
    parallel = sim(capsys, *args, "--jobs", "3")
    assert serial[0] == 0
    assert parallel == serial
    assert [json.loads(line)["strategy"] for line in serial[1].splitlines()] == sorted(STRATEGIES)


def test_at_80_columns_the_table_fits_best_first_and_says_why_two_rows_are_identical(
    small_fleet: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("--fleet", small_fleet, "--load", "0.7", "--duration", "10")
    _, as_json, _ = sim(capsys, *args, "--json")
    rows = [json.loads(line) for line in as_json.splitlines()]
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = sim(capsys, *args)
    assert (code, err) == (0, "")
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
    order = expected_order(rows)
    assert table_rows(out) == order
    assert [line.split()[:2] for line in out.splitlines() if "★" in line] == [
        ["★", order[0]],
        ["★", "best;"],
    ]
    assert "ranked by ttft_p99_s" in out
    assert "e2e" not in out  # the narrow layout leaves it to --json
    notes = " ".join(out.split())
    assert (
        "ran identically: affinity places every request without an affinity key (the "
        "simulator sends none) as weighted-least-connections does"
    ) in notes
    figures = ("throughput_rps", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s", "imbalance_factor")
    affinity = [by_name(rows)["affinity"][f] for f in figures]
    identical = [r["strategy"] for r in rows if [r[f] for f in figures] == affinity]
    assert f"{' and '.join(sorted(identical))} ran identically" in notes


def test_from_100_columns_the_table_shows_more_and_still_fits(
    small_fleet: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = sim(capsys, "--fleet", small_fleet, "--load", "0.7", "--duration", "10")
    assert code == 0
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 100
    assert "served" in out
    assert "e2e p99" in out


def test_max_sustainable_table_ranks_by_the_rate(
    small_fleet: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = sim(
        capsys, "--fleet", small_fleet, "--strategy", "round-robin", "--max-sustainable",
        "--search-steps", "2", "--duration", "10",
    )  # fmt: skip
    assert code == 0
    assert table_rows(out) == ["round-robin"]
    assert "★ round-robin" in out
    assert "ranked by max_sustainable_rps" in out
    assert "p99 TTFT under 2 s" in " ".join(out.split())


def test_ctrl_c_prints_the_rows_done_one_line_and_exits_130(small_fleet: str) -> None:
    """SIGINT once a row is out, with strategies running in worker processes: the rows done
    so far, one line saying so on stderr, no traceback from this process or its workers."""
    argv = [sys.executable, "-m", "console.cli", "sim", "--fleet", small_fleet,
            "--duration", "200", "--json", "--jobs", "2"]  # fmt: skip
    root = Path(__file__).resolve().parents[1]
    with subprocess.Popen(
        argv, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stderr is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        # Read through the same buffered files (communicate() would skip what readline read).
        rest, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=60)
    rows = [json.loads(line) for line in (first + rest).splitlines()]
    assert proc.returncode == 130
    assert err == f"gpurouter sim: interrupted: {len(rows)} of {len(STRATEGIES)} strategies done\n"
    assert [r["strategy"] for r in rows] == sorted(STRATEGIES)[: len(rows)]
