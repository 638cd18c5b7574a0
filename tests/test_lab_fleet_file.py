"""The lab's fleet file: one replica per engine at its loopback port, every weight at 1,
batch size and context from how the engines serve; the project's loader accepts it."""

from __future__ import annotations

from pathlib import Path

from router.config import load_fleet
from router.lab import EngineRecord, ServeOptions
from router.lab.fleet_file import write_fleet_file


def _record(i: int, port: int, core: int, size: str) -> EngineRecord:
    return EngineRecord(
        name=f"vllm-{i}",
        port=port,
        core=core,
        model_dir=f"/models/tiny-llama-{size}",
        served_model="tiny-llama",
        log=f"vllm-{i}.log",
    )


def test_the_fleet_file_lists_every_engine_at_weight_one(tmp_path: Path) -> None:
    records = [_record(0, 41001, 0, "2x256"), _record(1, 41002, 1, "8x512")]
    options = ServeOptions(max_model_len=2048, max_num_seqs=48, kv_cache_gib=2)
    path = tmp_path / "lab" / "fleet.yaml"
    write_fleet_file(path, "vllm", records, "tiny-llama", options)

    fleet = load_fleet(path)
    assert fleet.cluster == "lab-vllm"
    assert [(r.id, r.endpoint) for r in fleet.replicas] == [
        ("vllm-0", "http://127.0.0.1:41001"),
        ("vllm-1", "http://127.0.0.1:41002"),
    ]
    assert {r.weight for r in fleet.replicas} == {1.0}
    assert {r.model for r in fleet.replicas} == {"tiny-llama"}
    assert {r.batch_size for r in fleet.replicas} == {48}
    assert {r.max_context_tokens for r in fleet.replicas} == {2048}
    assert [r.tags for r in fleet.replicas] == [
        ("tiny-llama-2x256", "core-0"),
        ("tiny-llama-8x512", "core-1"),
    ]
    assert fleet.nodes[0].gpus[1].memory_gib == 2
