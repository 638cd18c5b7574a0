"""GPU telemetry: the versioned payloads node agents publish, and the NVML sampler behind them.

``schema`` holds the messages (:class:`GpuBatch`, :class:`NodeStatus`) with strict
``decode_*`` functions; ``nvml_sampler`` reads real GPUs. docs/telemetry.md describes both.
Importing this package imports neither pynvml nor the sampler module; the sampler loads on
first use (so ``python -m router.telemetry.nvml_sampler`` runs it fresh) and imports pynvml
in :meth:`NvmlSampler.init`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.telemetry.schema import (
    MAX_PAYLOAD_BYTES,
    SCHEMA_VERSION,
    GpuBatch,
    GpuInventory,
    GpuSample,
    MigDevice,
    NodeStatus,
    PayloadError,
    ProcessInfo,
    as_json,
    decode_gpus,
    decode_status,
    encode,
)

if TYPE_CHECKING:
    from router.telemetry.nvml_sampler import NvmlSampler, NvmlUnavailableError, SystemInfo

_FROM_SAMPLER = ("NvmlSampler", "NvmlUnavailableError", "SystemInfo")

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "SCHEMA_VERSION",
    "GpuBatch",
    "GpuInventory",
    "GpuSample",
    "MigDevice",
    "NodeStatus",
    "NvmlSampler",
    "NvmlUnavailableError",
    "PayloadError",
    "ProcessInfo",
    "SystemInfo",
    "as_json",
    "decode_gpus",
    "decode_status",
    "encode",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_SAMPLER:
        from router.telemetry import nvml_sampler

        return getattr(nvml_sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
