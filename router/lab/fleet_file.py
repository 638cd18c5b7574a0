"""The fleet file of a lab: one node, one replica per engine, every weight at 1.

Weights stay at 1 on purpose: the engines differ in speed, and finding that out is the
router's job (learned capacity), not the file's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from router.lab.engine_kind import ServeOptions
from router.lab.engines import EngineRecord

__all__ = ["fleet_yaml", "write_fleet_file"]

GPU_MODEL = "cpu-core"
"""What stands for a GPU in the file: each engine has one CPU core of its own."""


def fleet_yaml(
    kind: str, engines: Sequence[EngineRecord], served_model: str, options: ServeOptions
) -> str:
    """The fleet file's text."""
    lines = [
        f"# Written by `gpurouter lab {kind} up`: {len(engines)} {kind} engines on this",
        "# machine's CPU, each pinned to a core of its own. Every weight is 1: the router",
        "# learns how fast each engine is. Serve it with: gpurouter serve --config THIS_FILE",
        f"# The engines compute in {options.dtype}.",
        f"cluster: lab-{kind}",
        f"model: {served_model}",
        "",
        "nodes:",
        "  - name: lab",
        "    gpus:",
    ]
    lines += [
        f"      - {{index: {i}, model: {GPU_MODEL}, memory_gib: {options.kv_cache_gib}}}"
        for i in range(len(engines))
    ]
    lines.append("    replicas:")
    for i, engine in enumerate(engines):
        tag = Path(engine.model_dir).name
        lines.append(
            f'      - {{id: {engine.name}, endpoint: "http://127.0.0.1:{engine.port}", '
            f"gpus: [{i}], weight: 1, batch_size: {options.max_num_seqs}, "
            f"max_context_tokens: {options.max_model_len}, tags: [{tag}, core-{engine.core}]}}"
        )
    return "\n".join(lines) + "\n"


def write_fleet_file(
    path: Path,
    kind: str,
    engines: Sequence[EngineRecord],
    served_model: str,
    options: ServeOptions,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fleet_yaml(kind, engines, served_model, options))
