"""The labels of vLLM's ``vllm:cache_config_info`` for an emulated replica's KV cache.

vLLM publishes its ``CacheConfig`` as an info gauge (value 1) whose labels are the config's
fields, every value a string as Python writes it (``"None"``, ``"False"``, ``"0.9"``). The
router reads the cache's size from ``kv_cache_size_tokens`` (router/telemetry/
engine_metrics.py). The emulator fills the fields its performance model knows (sizes, block
size, memory) and gives the others the values a real vLLM 0.32 engine writes by default.
"""

from __future__ import annotations

from router.perf.model import Deployment, kv_bytes_per_token
from router.sim.engine import BLOCK_TOKENS

__all__ = ["ENGINE_INDEX", "cache_config_labels"]

ENGINE_INDEX = "0"
"""vLLM's ``engine`` label: the index of the engine in a data-parallel server; one here."""

_DEFAULTS = {
    "_block_size_resolved": "True",
    "cache_dtype": "auto",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    # The emulated engine has no prefix cache (every prompt is computed in full).
    "enable_prefix_caching": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}


def cache_config_labels(
    kv_capacity_tokens: int, deployment: Deployment, max_model_len: int
) -> dict[str, str]:
    """The info gauge's labels for a cache of ``kv_capacity_tokens``, keys sorted."""
    known = {
        "block_size": str(BLOCK_TOKENS),
        "effective_attention_block_size": str(BLOCK_TOKENS),
        "engine": ENGINE_INDEX,
        "gpu_memory_utilization": str(deployment.mem_fraction),
        "kv_cache_max_concurrency": str(kv_capacity_tokens / max_model_len),
        "kv_cache_memory_bytes": str(kv_capacity_tokens * kv_bytes_per_token(deployment.model)),
        "kv_cache_size_tokens": str(kv_capacity_tokens),
        "num_gpu_blocks": str(kv_capacity_tokens // BLOCK_TOKENS),
    }
    return dict(sorted((_DEFAULTS | known).items()))
