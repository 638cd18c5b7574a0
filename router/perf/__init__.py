"""The GPU performance model: profiles as data, and the formulas the emulator and the fleet
simulator share.

``profiles`` reads GPU and model profiles (YAML in this package, extendable by the user);
``model`` turns them into step times, KV capacity and saturation throughput, as pure
functions over plain data; ``calibration`` checks the model against published measurements.
docs/performance-model.md explains the formulas and shows the calibration.
"""

from router.perf.model import (
    DEFAULT_EFFICIENCY,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MEM_FRACTION,
    Deployment,
    Efficiency,
    ModelDoesNotFit,
    RunningSequence,
    Saturation,
    WorkloadMix,
    compute_dtype,
    decode_step_seconds,
    kv_bytes_per_token,
    kv_capacity_tokens,
    prefill_seconds,
    saturation,
    saturation_rps,
    step_seconds,
    weight_bytes,
)
from router.perf.profiles import (
    DTYPE_BYTES,
    GpuProfile,
    ModelProfile,
    ProfileCatalog,
    UnknownProfileError,
    default_catalog,
    load_catalog,
)

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_MEM_FRACTION",
    "DTYPE_BYTES",
    "Deployment",
    "Efficiency",
    "GpuProfile",
    "ModelDoesNotFit",
    "ModelProfile",
    "ProfileCatalog",
    "RunningSequence",
    "Saturation",
    "UnknownProfileError",
    "WorkloadMix",
    "compute_dtype",
    "decode_step_seconds",
    "default_catalog",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "load_catalog",
    "prefill_seconds",
    "saturation",
    "saturation_rps",
    "step_seconds",
    "weight_bytes",
]
