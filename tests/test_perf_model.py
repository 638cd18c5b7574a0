"""The GPU performance model: profiles, formulas, fitting, saturation and calibration."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.errors import ConfigError
from router.perf import (
    Deployment,
    Efficiency,
    ModelDoesNotFit,
    RunningSequence,
    UnknownProfileError,
    WorkloadMix,
    compute_dtype,
    decode_step_seconds,
    default_catalog,
    kv_bytes_per_token,
    kv_capacity_tokens,
    load_catalog,
    prefill_seconds,
    saturation,
    saturation_rps,
    step_seconds,
    weight_bytes,
)
from router.perf.calibration import (
    DEFAULT_TOLERANCE,
    calibration_table,
    fit_efficiency,
    load_calibration,
    relative_error,
)
from router.perf.model import DEFAULT_EFFICIENCY, batch_step_function, batch_step_seconds

CATALOG = default_catalog()
EFF = Efficiency(mfu=0.5, bandwidth=0.8, tensor_parallel=0.9)
"""Round figures for hand-computed checks, independent of the fitted defaults."""
CONV = WorkloadMix(prompt_tokens=1155, output_tokens=211)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "performance-model.md"
MIB = 2**20


def deploy(gpu: str, model: str, tp: int = 1, **kwargs: object) -> Deployment:
    return Deployment(CATALOG.gpu(gpu), CATALOG.model(model), tp, **kwargs)  # type: ignore[arg-type]


# --- profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tflops", "bandwidth_gbs", "bf16"),
    [
        ("H100-SXM", 989.4, 3350, True),
        ("H200", 989.4, 4800, True),
        ("A100-80GB", 312, 2039, True),
        ("A100-40GB", 312, 1555, True),
        ("V100-32GB", 125, 900, False),
        ("V100-16GB", 125, 900, False),
        ("L40S", 362.05, 864, True),
        ("A10", 125, 600, True),
        ("L4", 121, 300, True),
        ("T4", 65, 320, False),
    ],
)
def test_every_listed_gpu_has_its_datasheet_figures(
    name: str, tflops: float, bandwidth_gbs: float, bf16: bool
) -> None:
    gpu = CATALOG.gpu(name)
    assert (gpu.fp16_tflops, gpu.bandwidth_gbs, gpu.bf16) == (tflops, bandwidth_gbs, bf16)
    assert gpu.peak_flops == tflops * 1e12
    assert gpu.memory_bytes == gpu.memory_mib * MIB


@pytest.mark.parametrize(
    ("name", "layers", "kv_heads", "kv_bytes"),
    [
        ("Llama-3.1-8B", 32, 8, 2 * 32 * 8 * 128 * 2),
        ("Qwen2.5-7B", 28, 4, 2 * 28 * 4 * 128 * 2),
        ("Llama-3.1-70B", 80, 8, 2 * 80 * 8 * 128 * 2),
        ("Llama-2-7B", 32, 32, 2 * 32 * 32 * 128 * 2),
    ],
)
def test_kv_bytes_per_token_is_two_times_layers_kv_heads_head_dim_dtype_bytes(
    name: str, layers: int, kv_heads: int, kv_bytes: int
) -> None:
    model = CATALOG.model(name)
    assert (model.layers, model.kv_heads, model.head_dim, model.dtype_bytes) == (
        layers,
        kv_heads,
        128,
        2,
    )
    assert kv_bytes_per_token(model) == kv_bytes


def test_weight_bytes_are_params_times_dtype_bytes() -> None:
    assert weight_bytes(CATALOG.model("Llama-3.1-8B")) == 8_030_261_248 * 2


def test_profiles_are_found_by_alias_without_regard_to_case() -> None:
    assert CATALOG.gpu("nvidia a100-sxm4-80gb").name == "A100-80GB"
    assert CATALOG.model("meta-llama/llama-3.1-8b-instruct").name == "Llama-3.1-8B"


def test_an_unknown_profile_names_close_matches() -> None:
    with pytest.raises(UnknownProfileError, match="did you mean A100-80GB"):
        CATALOG.gpu("A100-80G")


def test_a_user_file_adds_and_overrides_profiles(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    extra.write_text(
        "gpus:\n"
        "  RTX-4090:\n"
        "    fp16_tflops: 165.2\n    bf16: true\n    bandwidth_gbs: 1008\n"
        "    memory_mib: 24564\n    aliases: [GeForce RTX 4090]\n"
        "  A10:\n"
        "    fp16_tflops: 125\n    bf16: true\n    bandwidth_gbs: 500\n    memory_mib: 23028\n"
    )
    catalog = load_catalog([extra])
    assert catalog.gpu("geforce rtx 4090").bandwidth_gbs == 1008
    assert catalog.gpu("A10").bandwidth_gbs == 500
    assert catalog.gpu("NVIDIA A10").bandwidth_gbs == 500
    assert catalog.model("Llama-3.1-8B") == CATALOG.model("Llama-3.1-8B")


def test_every_problem_in_a_profile_file_is_reported_with_file_line_and_key(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "gpus:\n"
        "  X1:\n"  # line 2
        "    fp16_tflops: -3\n"  # line 3
        "    bf16: yes please\n"  # line 4
        "    bandwith_gbs: 100\n"  # line 5
        "    memory_mib: 1024\n"
        "models:\n"
        "  M1:\n"  # line 8
        "    params: 10\n    layers: 2\n    attention_heads: 6\n"
        "    kv_heads: 4\n"  # line 12
        "    head_dim: 8\n    dtype: fp8\n"  # dtype on line 14
        "    max_context_tokens: 64\n"
        "extra: 1\n"  # line 16
    )
    with pytest.raises(ConfigError) as caught:
        load_catalog([bad])
    found = {(p.line, p.key) for p in caught.value.problems}
    assert found == {
        (3, "gpus.X1.fp16_tflops"),
        (4, "gpus.X1.bf16"),
        (5, "gpus.X1.bandwith_gbs"),
        (2, "gpus.X1.bandwidth_gbs"),
        (14, "models.M1.dtype"),
        (16, "extra"),
    }
    assert all(p.file == str(bad) for p in caught.value.problems)
    assert "did you mean bandwidth_gbs" in str(caught.value)


def test_head_counts_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "heads.yaml"
    bad.write_text(
        "models:\n  M1:\n    params: 10\n    layers: 2\n    attention_heads: 6\n"
        "    kv_heads: 4\n    head_dim: 8\n    dtype: fp16\n    max_context_tokens: 64\n"
    )
    with pytest.raises(ConfigError, match=r"heads.yaml:6: models.M1.kv_heads: must divide"):
        load_catalog([bad])


def test_an_alias_that_names_another_profile_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "alias.yaml"
    bad.write_text(
        "gpus:\n  Mine:\n    fp16_tflops: 1\n    bf16: false\n    bandwidth_gbs: 1\n"
        "    memory_mib: 1\n    aliases: [T4]\n"
    )
    with pytest.raises(ConfigError, match="'T4' already names 'T4'"):
        load_catalog([bad])


def test_a_file_that_is_not_yaml_names_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("gpus:\n  A: [1, 2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: <file>: not valid YAML"):
        load_catalog([bad])


# --- memory: weights and KV cache ---------------------------------------------------------


def test_kv_capacity_of_llama_8b_on_a100_80gb_at_mem_fraction_0_9() -> None:
    free = 81920 * MIB * 0.9 - 8_030_261_248 * 2
    expected = math.floor(free / 131_072)
    capacity = kv_capacity_tokens(CATALOG.gpu("A100-80GB"), CATALOG.model("Llama-3.1-8B"))
    assert capacity == expected == 467_291
    assert 4e5 < capacity < 5e5


def test_a_70b_model_is_refused_on_one_a100_80gb_and_told_what_it_needs() -> None:
    with pytest.raises(ModelDoesNotFit, match=r"1 x A100-80GB.*tensor_parallel >= 2"):
        deploy("A100-80GB", "Llama-3.1-70B")


def test_a_70b_model_fits_two_h100s_with_tensor_parallelism() -> None:
    replica = deploy("H100-SXM", "Llama-3.1-70B", tp=2)
    expected = math.floor((2 * 81559 * MIB * 0.9 - 70_553_706_496 * 2) / 327_680)
    assert replica.kv_capacity_tokens == expected
    assert expected > 30_000


def test_an_8b_model_does_not_fit_one_16gb_card_but_fits_two_t4s() -> None:
    for gpu in ("T4", "V100-16GB"):
        with pytest.raises(ModelDoesNotFit):
            deploy(gpu, "Llama-3.1-8B")
    assert deploy("T4", "Llama-3.1-8B", tp=2).kv_capacity_tokens > 0


def test_max_model_len_refuses_a_cache_that_cannot_hold_one_full_sequence() -> None:
    with pytest.raises(ModelDoesNotFit, match="fewer than max_model_len 131072"):
        deploy("L4", "Llama-3.1-8B", max_model_len=131_072)
    assert deploy("L4", "Llama-3.1-8B", max_model_len=8192).kv_capacity_tokens >= 8192


def test_tensor_parallel_must_divide_the_attention_heads() -> None:
    with pytest.raises(ValueError, match=r"divide Qwen2\.5-7B's 28 attention heads"):
        deploy("A100-80GB", "Qwen2.5-7B", tp=8)


# --- bf16 on cards without it -------------------------------------------------------------


def test_a_bf16_model_runs_as_fp16_on_v100_and_t4_with_the_same_bytes() -> None:
    model = CATALOG.model("Llama-3.1-8B")
    assert compute_dtype(CATALOG.gpu("V100-32GB"), model) == "fp16"
    assert compute_dtype(CATALOG.gpu("T4"), model) == "fp16"
    assert compute_dtype(CATALOG.gpu("A100-80GB"), model) == "bf16"
    v100 = deploy("V100-32GB", "Llama-3.1-8B")
    assert v100.dtype == "fp16"
    expected = math.floor((32510 * MIB * 0.9 - weight_bytes(model)) / 131_072)
    assert v100.kv_capacity_tokens == expected
    assert compute_dtype(CATALOG.gpu("V100-32GB"), CATALOG.model("Llama-2-7B")) == "fp16"


# --- step times ---------------------------------------------------------------------------


def test_a_lone_prefill_is_compute_bound_with_causal_attention() -> None:
    replica = deploy("H100-SXM", "Llama-3.1-8B", efficiency=EFF)
    n = 2048
    flops = 2 * 8_030_261_248 * n + 2 * 32 * (32 * 128) * n * n
    assert prefill_seconds(replica, n) == pytest.approx(flops / (989.4e12 * 0.5))


def test_a_decode_step_at_batch_one_is_memory_bound() -> None:
    replica = deploy("A100-80GB", "Llama-3.1-8B", efficiency=EFF)
    expected = (8_030_261_248 * 2 + 131_072 * 1000) / (2039e9 * 0.8)
    assert decode_step_seconds(replica, 1, 1000) == pytest.approx(expected)
    single = step_seconds(replica, [RunningSequence(1000)])
    assert single == pytest.approx(expected)


def test_a_large_decode_batch_becomes_compute_bound() -> None:
    """Beyond ~F/B sequences the matrix products outlast the weight read."""
    replica = deploy("A100-80GB", "Llama-3.1-8B", efficiency=EFF)
    batch, context = 512, 100
    compute = 2 * 8_030_261_248 * batch / (312e12 * 0.5)
    kv_read = 131_072 * batch * context / (2039e9 * 0.8)
    assert compute > 8_030_261_248 * 2 / (2039e9 * 0.8)
    assert decode_step_seconds(replica, batch, context) == pytest.approx(compute + kv_read)


def test_a_mixed_step_shares_one_weight_read_between_prefill_and_decode() -> None:
    replica = deploy("A100-80GB", "Llama-3.1-8B", efficiency=EFF)
    running = [RunningSequence(500)] * 8 + [RunningSequence(context_tokens=256, prefill_tokens=512)]
    new, cached = 8 + 512, 8 * 500 + 256
    flops_rate, bandwidth = 312e12 * 0.5, 2039e9 * 0.8
    matmuls = max(2 * 8_030_261_248 * new / flops_rate, 8_030_261_248 * 2 / bandwidth)
    attention = 2 * 32 * 4096 * 512 * (2 * 256 + 512) / flops_rate
    expected = matmuls + 131_072 * cached / bandwidth + attention
    assert step_seconds(replica, running) == pytest.approx(expected)


def test_an_empty_step_takes_no_time() -> None:
    assert step_seconds(deploy("T4", "Llama-2-7B", tp=2), []) == 0.0
    assert decode_step_seconds(deploy("T4", "Llama-2-7B", tp=2), 0, 100) == 0.0


def test_tensor_parallelism_splits_the_work_at_a_cost_per_doubling() -> None:
    one = deploy("H100-SXM", "Llama-3.1-8B", efficiency=EFF)
    four = deploy("H100-SXM", "Llama-3.1-8B", tp=4, efficiency=EFF)
    assert four.flops == pytest.approx(4 * one.flops * 0.9**2)
    assert four.bandwidth == pytest.approx(4 * one.bandwidth * 0.9**2)
    assert decode_step_seconds(four, 1, 100) < decode_step_seconds(one, 1, 100)


@given(
    contexts=st.lists(st.integers(0, 8192), min_size=1, max_size=40),
    extra=st.integers(0, 8192),
    chunk=st.integers(0, 2048),
)
def test_one_more_sequence_never_makes_a_step_shorter(
    contexts: list[int], extra: int, chunk: int
) -> None:
    replica = deploy("A10", "Qwen2.5-7B")
    running = [RunningSequence(c) for c in contexts]
    before = step_seconds(replica, running)
    after = step_seconds(replica, [*running, RunningSequence(extra, chunk)])
    assert after >= before > 0


# --- saturation ---------------------------------------------------------------------------


def test_saturation_follows_the_mean_step_formula() -> None:
    replica = deploy("A100-80GB", "Llama-3.1-8B", efficiency=EFF)
    result = saturation(replica, CONV, max_num_seqs=256)
    assert result.batch == 256
    assert not result.kv_limited
    starts = 256 / 211
    new = 256 + starts * 1155
    flops_rate, bandwidth = 312e12 * 0.5, 2039e9 * 0.8
    step = (
        max(2 * 8_030_261_248 * new / flops_rate, 8_030_261_248 * 2 / bandwidth)
        + 131_072 * 256 * (1155 + 211 / 2) / bandwidth
        + starts * 2 * 32 * 4096 * 1155 * 1155 / flops_rate
    )
    assert result.step_seconds == pytest.approx(step)
    assert result.rps == pytest.approx(256 / (211 * step))
    assert result.output_tokens_per_s == pytest.approx(result.rps * 211)


def test_a_small_kv_cache_limits_the_batch() -> None:
    replica = deploy("V100-32GB", "Llama-3.1-8B")
    result = saturation(replica, CONV, max_num_seqs=256)
    assert result.kv_limited
    assert result.batch == math.floor(replica.kv_capacity_tokens / (1155 + 211 / 2)) < 256


def test_saturation_orders_h100_over_a100_over_v100_over_t4_for_llama_8b() -> None:
    """One replica each; Llama-3.1-8B needs two T4s (16 GB of weights)."""
    rps = [
        saturation_rps(deploy(gpu, "Llama-3.1-8B", tp), CONV)
        for gpu, tp in [("H100-SXM", 1), ("A100-80GB", 1), ("V100-32GB", 1), ("T4", 2)]
    ]
    assert rps == sorted(rps, reverse=True)
    assert len(set(rps)) == 4


def test_a_request_larger_than_the_kv_cache_has_no_saturation_throughput() -> None:
    replica = deploy("L4", "Llama-3.1-8B")
    with pytest.raises(ModelDoesNotFit, match="less than one request"):
        saturation(replica, WorkloadMix(100_000, 1000))


def test_bad_efficiencies_and_mixes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"Efficiency.mfu must be in \(0, 1\]"):
        Efficiency(mfu=1.5)
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        WorkloadMix(100, 0)


# --- calibration --------------------------------------------------------------------------


def test_every_calibration_row_is_within_its_documented_error() -> None:
    rows = load_calibration()
    assert len(rows) >= 5
    for row in rows:
        assert abs(relative_error(row)) <= row.tolerance, row.id
        assert row.tolerance <= DEFAULT_TOLERANCE or row.why


def test_the_default_efficiencies_are_the_fit_to_the_calibration_rows() -> None:
    best, _ = fit_efficiency(load_calibration())
    assert best == DEFAULT_EFFICIENCY


def test_the_docs_hold_the_calibration_table_bench_calibrate_prints() -> None:
    assert calibration_table(load_calibration()) in DOCS.read_text(encoding="utf-8")


def test_a_calibration_row_with_a_wide_tolerance_must_say_why(tmp_path: Path) -> None:
    bad = tmp_path / "cal.yaml"
    bad.write_text(
        "rows:\n  - id: x\n    gpu: T4\n    model: Llama-2-7B\n    metric: ttft_ms\n"
        "    prompt_tokens: 10\n    measured: 5\n    source: s\n    url: u\n    reported: r\n"
        "    engine: e\n    conditions: c\n    tolerance: 0.9\n"
    )
    with pytest.raises(ConfigError, match=r"rows\[0\]\.why: a tolerance above 0.3 needs a reason"):
        load_calibration(bad)


@given(
    gpu=st.sampled_from(["H100-SXM", "A100-80GB", "V100-32GB", "L4"]),
    prefill=st.integers(0, 16_384),
    seqs=st.integers(0, 512),
    context=st.integers(0, 2_000_000),
)
def test_the_precomputed_step_is_the_reference_step_to_the_last_bit(
    gpu: str, prefill: int, seqs: int, context: int
) -> None:
    catalog = default_catalog()
    deployment = Deployment(catalog.gpu(gpu), catalog.model("meta-llama/Llama-3.1-8B-Instruct"))
    step = batch_step_function(deployment)
    assert step(prefill, seqs, context) == batch_step_seconds(deployment, prefill, seqs, context)


def test_a_known_kv_size_caps_the_cache_and_nonsense_is_refused() -> None:
    room = deploy("V100-32GB", "Llama-3.1-8B").kv_capacity_tokens
    capped = replace(deploy("V100-32GB", "Llama-3.1-8B"), kv_limit=100_000)
    assert capped.kv_capacity_tokens == 100_000 < room
    larger = replace(capped, kv_limit=room * 2)
    assert larger.kv_capacity_tokens == room  # no more than the memory holds
    with pytest.raises(ValueError, match="kv_limit must be >= 1"):
        replace(capped, kv_limit=0)
