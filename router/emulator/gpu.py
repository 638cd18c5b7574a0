"""What an emulated GPU would show NVML: utilization, memory, power, temperature, clock.

Readings come from the engine, so a telemetry agent can publish them as if read from a card:

- ``gpu_util_pct``: the share of the last sample window the engine spent in steps (engine
  seconds busy over wall seconds times the time scale), as NVML's utilization is the share of
  time a kernel ran;
- ``fb_used_mib``: weights plus the KV cache in use, split evenly over tensor-parallel GPUs;
- ``power_w``: ``idle + (tdp - idle) * util`` from the GPU profile's ``tdp_w`` and ``idle_w``;
- ``temp_c`` and ``sm_clock_mhz``: simple functions of power and utilization, set so an
  H100 reads as the recorded ones do (docs/readings: 45 C and 375 MHz idle, 67 C and
  1515 MHz under load).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from router.config.schema import GpuConfig, NodeConfig
from router.perf.profiles import GpuProfile, ProfileCatalog, UnknownProfileError
from router.telemetry.schema import GpuInventory, GpuSample

__all__ = ["BusyWindow", "GpuLoad", "gpu_inventory", "gpu_samples"]

_MIB = 2**20
_IDLE_CLOCK_MHZ, _BUSY_CLOCK_MHZ = 375, 1515
_COOL_C, _HOT_C = 42.0, 67.0
"""Temperature at no power and at the power limit."""


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """One emulated GPU's load at a reading."""

    replica: str
    util: float
    """Busy share of the last window, 0..1."""
    used_bytes: int


class BusyWindow:
    """The busy share of the time between two readings of one engine.

    ``busy_s`` must be the engine seconds spent in steps up to ``wall`` (the driver's
    ``busy_reading``), counting the elapsed part of a step still running: a window that
    falls inside one long step is then busy throughout, never idle.
    """

    def __init__(self, wall: float, busy_s: float, time_scale: float) -> None:
        self._wall, self._busy = wall, busy_s
        self._scale = time_scale
        self._last = 0.0

    def read(self, wall: float, busy_s: float) -> float:
        """Busy share since the previous reading, 0..1; the previous share if no time passed."""
        elapsed = (wall - self._wall) * self._scale
        if elapsed > 0:
            # Rounding of the two clocks' products can leave a hair over 1.
            self._last = min(1.0, max(0.0, (busy_s - self._busy) / elapsed))
            self._wall, self._busy = wall, busy_s
        return self._last


def gpu_samples(
    node: NodeConfig, loads: Mapping[int, GpuLoad], catalog: ProfileCatalog
) -> list[GpuSample]:
    """A reading of every GPU of ``node``; ``loads`` by GPU index (absent: not emulated, idle)."""
    owners = {i: r.id for r in node.replicas for i in r.gpus}
    return [_sample(node.name, gpu, loads.get(gpu.index), owners, catalog) for gpu in node.gpus]


def gpu_inventory(node: NodeConfig, catalog: ProfileCatalog) -> list[GpuInventory]:
    """The node's GPUs as an agent's birth message lists them."""
    out = []
    for gpu in node.gpus:
        profile = _profile(gpu, catalog)
        total = profile.memory_mib if profile else round(gpu.memory_gib * 1024)
        name = _nvml_name(profile) if profile else gpu.model
        out.append(GpuInventory(gpu.index, _uuid(node.name, gpu.index), name, total))
    return out


def _sample(
    node: str,
    gpu: GpuConfig,
    load: GpuLoad | None,
    owners: Mapping[int, str],
    catalog: ProfileCatalog,
) -> GpuSample:
    profile = _profile(gpu, catalog)
    util = load.util if load else 0.0
    power, limit = _power(profile, util)
    total = profile.memory_mib if profile else round(gpu.memory_gib * 1024)
    used = min(total, round(load.used_bytes / _MIB)) if load else 0
    return GpuSample(
        index=gpu.index,
        uuid=_uuid(node, gpu.index),
        name=_nvml_name(profile) if profile else gpu.model,
        gpu_util_pct=round(100 * util, 1),
        fb_used_mib=used,
        fb_total_mib=total,
        power_w=power,
        power_limit_w=limit,
        temp_c=None
        if power is None or not limit
        else round(_COOL_C + (_HOT_C - _COOL_C) * power / limit),
        sm_clock_mhz=round(_IDLE_CLOCK_MHZ + (_BUSY_CLOCK_MHZ - _IDLE_CLOCK_MHZ) * util),
        replica=owners.get(gpu.index),
    )


def _power(profile: GpuProfile | None, util: float) -> tuple[float | None, float | None]:
    if profile is None or profile.tdp_w is None:
        return None, None
    idle = profile.idle_power_w or 0.0
    return round(idle + (profile.tdp_w - idle) * util, 1), profile.tdp_w


def _profile(gpu: GpuConfig, catalog: ProfileCatalog) -> GpuProfile | None:
    try:
        return catalog.gpu(gpu.model)
    except UnknownProfileError:
        return None


def _nvml_name(profile: GpuProfile) -> str:
    """The name NVML gives the card: its ``NVIDIA ...`` or ``Tesla ...`` alias if it has one."""
    for alias in profile.aliases:
        if alias.startswith(("NVIDIA ", "Tesla ")):
            return alias
    return profile.name


def _uuid(node: str, index: int) -> str:
    # Stable across runs, so a restarted emulator reads as the same cards.
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpurouter-emulator/{node}/{index}')}"
