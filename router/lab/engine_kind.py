"""What the lab needs to know about one kind of inference engine (vLLM today; SGLang and TGI
later, the same way): what to install, how to launch it, how to serve a model with it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from router.lab.cpu_dtype import host_dtype

__all__ = ["EngineKind", "ServeOptions"]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How each engine of a lab serves its model."""

    max_model_len: int = 2048
    """Longest prompt plus output an engine accepts."""
    max_num_seqs: int = 64
    """Most requests an engine runs at once; the fleet file's batch size says the same."""
    kv_cache_gib: int = 1
    """Memory for each engine's KV cache, in whole GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``)."""
    kv_blocks: int | None = None
    """Fewer KV-cache blocks than that memory holds (vLLM's ``--num-gpu-blocks-override``):
    a cache small enough to make the engine preempt, for tests."""
    dtype: str = field(default_factory=host_dtype)
    """The number format the engines compute in (vLLM's ``--dtype``): by default the faster
    one on this CPU (router/lab/cpu_dtype.py)."""


@dataclass(frozen=True, slots=True)
class EngineKind:
    """One engine the lab can install and run."""

    name: str
    """The name on the command line: ``gpurouter lab NAME up``."""
    packages: tuple[str, ...]
    """pip requirements of its environment."""
    remove_after: tuple[str, ...]
    """Distributions uninstalled after the install (ones that break the import)."""
    launcher: str
    """Source of the script the engine is started with (``launch.py`` in the environment)."""
    check: tuple[str, ...]
    """Arguments to the launcher that prove the install works; run once, at build time."""
    serve_args: Callable[[Path, str, int, ServeOptions], list[str]]
    """Launcher arguments that serve (model directory, served name, port, options)."""
    serve_env: Callable[[int, ServeOptions], Mapping[str, str]]
    """Environment variables of an engine pinned to a core."""
    core_title: str
    """Process title of the engine's compute process (the one a hung GPU would stop)."""
    pip_options: tuple[str, ...] = ()
    """Extra options of the pip install (tests use ``--no-index``)."""

    @property
    def recipe(self) -> dict[str, list[str]]:
        """What decides the environment's contents: a built one with another recipe is stale."""
        return {
            "packages": list(self.packages),
            "remove_after": list(self.remove_after),
            "launcher": [self.launcher],
        }
