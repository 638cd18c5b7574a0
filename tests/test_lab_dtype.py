"""The lab's engines compute in bf16 only where the CPU has bf16 instructions (float32, the
faster format elsewhere, was measured 1.5-2.2x faster on a host without them), and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.lab import ServeOptions, cpu_dtype
from router.lab.cpu_dtype import cpu_flags, dtype_for_flags, host_dtype
from router.lab.state import STATE_FILE, load_state
from router.lab.vllm import VLLM

_WITHOUT_BF16 = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu avx512_bf16
"""


def test_the_first_processor_s_flags_are_read() -> None:
    flags = cpu_flags(_WITHOUT_BF16)
    assert "avx512_vnni" in flags
    assert "avx512_bf16" not in flags
    assert "spectre_v1" not in flags
    assert cpu_flags("processor\t: 0\n") == frozenset()


def test_bf16_only_where_the_cpu_has_it() -> None:
    assert dtype_for_flags(cpu_flags(_WITHOUT_BF16)) == "float32"
    assert dtype_for_flags(frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert dtype_for_flags(frozenset({"amx_bf16", "amx_tile"})) == "bfloat16"


def test_a_cpu_that_cannot_be_read_gets_float32(tmp_path: Path) -> None:
    assert host_dtype(tmp_path / "no-cpuinfo") == "float32"
    listed = tmp_path / "cpuinfo"
    listed.write_text("processor\t: 0\nflags\t\t: avx512f avx512_bf16\n")
    assert host_dtype(listed) == "bfloat16"


def test_the_engine_is_started_in_the_chosen_format(tmp_path: Path) -> None:
    args = VLLM.serve_args(tmp_path, "tiny-llama", 8000, ServeOptions(dtype="float32"))
    assert args[args.index("--dtype") + 1] == "float32"


def test_a_lab_recorded_before_the_choice_reads_as_the_models_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a host without bf16, where a lab brought up now would run float32, a state file
    from before the choice still says bf16, what its engines were started in."""
    without = tmp_path / "cpuinfo"
    without.write_text(_WITHOUT_BF16)
    monkeypatch.setattr(cpu_dtype, "_CPUINFO", without)
    assert ServeOptions().dtype == "float32"
    document = {
        "kind": "vllm",
        "options": {"max_model_len": 2048, "max_num_seqs": 64, "kv_cache_gib": 1},
        "fleet_file": str(tmp_path / "fleet.yaml"),
        "engines": [],
    }
    (tmp_path / STATE_FILE).write_text(json.dumps(document))
    state = load_state(tmp_path)
    assert state is not None
    assert state.options.dtype == "bfloat16"
