"""The number format a lab engine computes in: bf16 where the CPU has instructions for it.

vLLM for CPU computes in the model's bf16 by default. On a CPU whose AVX-512 has no bf16
(no ``avx512_bf16`` or ``amx_bf16`` flag) torch converts every operand instead, and the lab's
engines ran 1.5x (the small model) and 2.2x (the large one) slower than in float32 on such a
host (docs/real-engines.md): fp32 is the faster format there, and a tiny random-weight model
loses nothing by it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DTYPES", "cpu_flags", "dtype_for_flags", "host_dtype"]

DTYPES = ("bfloat16", "float32")
"""What the lab can ask an engine for (vLLM's ``--dtype``)."""

_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of the first processor listed in ``cpuinfo``'s text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def dtype_for_flags(flags: frozenset[str]) -> str:
    """bf16 where the CPU computes it natively, float32 elsewhere."""
    return "bfloat16" if flags & _BF16_FLAGS else "float32"


def host_dtype(cpuinfo: Path | None = None) -> str:
    """The faster format on this machine (``cpuinfo``: where its CPU is described, by default
    /proc/cpuinfo); float32 where its CPU cannot be read."""
    try:
        text = (cpuinfo or _CPUINFO).read_text()
    except OSError:
        return "float32"
    return dtype_for_flags(cpu_flags(text))
