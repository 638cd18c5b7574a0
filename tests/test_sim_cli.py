"""`gpurouter sim`: the fields it prints, its table, its search, and how it refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.cli import main
from router.strategies import STRATEGIES

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
        "--duration",
        "30",
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
