"""Read a node's GPUs through NVML (nvidia-ml-py's ``pynvml`` module).

NVML calls block (a few milliseconds per GPU, more with many processes), so the agent runs
:meth:`NvmlSampler.sample` in a worker thread: ``await asyncio.to_thread(sampler.sample, ...)``.

Every field is read on its own: a field the card does not support (or will not report) is
left out and the reason kept in :attr:`NvmlSampler.field_errors`; a GPU that fell off the bus
is reported as ``lost`` and the others are still read. When NVML cannot start at all (no
driver, no library) :meth:`NvmlSampler.init` raises :class:`NvmlUnavailableError`, the cue to
emulate instead. The NVML module is injected; tests pass a stand-in (tests/fake_nvml.py).

``python -m router.telemetry.nvml_sampler`` prints one real reading.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import TracebackType
from typing import Any

from router.errors import TelemetryError
from router.telemetry.schema import (
    INT_RANGES,
    MAX_GPUS,
    MAX_MIG_DEVICES,
    MAX_PROCESSES,
    MAX_TEXT,
    NUMBER_RANGES,
    GpuBatch,
    GpuInventory,
    GpuSample,
    MigDevice,
    NodeStatus,
    PayloadError,
    ProcessInfo,
    as_json,
    encode,
)

MIB = 1024 * 1024
_NOT_AVAILABLE = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)  # NVML_VALUE_NOT_AVAILABLE, uint and ulonglong
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found: no NVIDIA driver installed",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the NVIDIA kernel driver is not loaded",
    "NVML_ERROR_NO_PERMISSION": "no permission to open the GPU devices",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver library and kernel module differ; reload them",
}


class NvmlUnavailableError(TelemetryError):
    """NVML cannot be used on this machine (no driver, library or permission): emulate."""

    title = "NVML unavailable"


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """What NVML says about the node as a whole; None where it would not say."""

    driver: str | None
    nvml_version: str | None
    cuda_driver: str | None
    """Highest CUDA version the driver supports, as ``major.minor``."""


class _GpuLostError(Exception):
    """Internal: a call said the GPU is gone; the GPU is reported as lost."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NvmlSampler:
    """Reads every GPU of this node through NVML; use as a context manager or init/shutdown.

    ``nvml`` is the pynvml module or a stand-in with the same functions (default: pynvml,
    imported by :meth:`init`). ``wall_clock`` gives the Unix time stamped on each reading;
    ``period_s`` is the sample period the messages announce; ``read_pcie=False`` skips the
    PCIe counters, which block about 40 ms per GPU.
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        wall_clock: Callable[[], float] = time.time,
        period_s: float = 1.0,
        read_pcie: bool = True,
    ) -> None:
        self._given = nvml
        self._nvml: Any = None
        self._wall_clock = wall_clock
        self.period_s = period_s
        self.read_pcie = read_pcie
        """PCIe throughput costs about 40 ms per GPU per sample (two 20 ms NVML windows)."""
        self.field_errors: dict[int, dict[str, str]] = {}
        """Per GPU index, the fields the last reading left out and why."""
        self.system_errors: dict[str, str] = {}
        """The node-wide values :meth:`system_info` could not read, and why."""
        self._identity: dict[int, tuple[str | None, str | None]] = {}

    def init(self) -> None:
        """Start NVML; NvmlUnavailableError when it cannot start. Calling it twice is harmless."""
        if self._nvml is not None:
            return
        nvml = self._given if self._given is not None else _import_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailableError(_init_message(nvml, exc)) from None
        self._nvml = nvml

    def shutdown(self) -> None:
        """Stop NVML; errors while stopping are ignored (there is nothing left to do)."""
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlShutdown()

    def __enter__(self) -> NvmlSampler:
        self.init()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def system_info(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions, each read on its own."""
        nvml = self._started()
        self.system_errors = {}
        read = _Reader(nvml, None, self.system_errors)
        cuda = read.call("nvmlSystemGetCudaDriverVersion", fields=("cuda_driver",), bare=True)
        return SystemInfo(
            driver=_text(read.call("nvmlSystemGetDriverVersion", fields=("driver",), bare=True)),
            nvml_version=_text(
                read.call("nvmlSystemGetNVMLVersion", fields=("nvml_version",), bare=True)
            ),
            cuda_driver=None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}",
        )

    def inventory(self) -> tuple[GpuInventory, ...]:
        """Index, UUID, name and memory of each GPU, for the birth message."""
        return tuple(self._per_gpu(self._inventory_one, None))

    def birth(
        self, node: str, session: int, agent_version: str, models: Sequence[str] = ()
    ) -> NodeStatus:
        """The ``online`` status message for this node (the will is the same, ``offline``)."""
        info = self.system_info()
        return NodeStatus(
            node=node,
            state="online",
            session=session,
            agent_version=agent_version,
            sample_period_s=self.period_s,
            gpus=self.inventory(),
            ts=self._wall_clock(),
            driver=info.driver,
            nvml_version=info.nvml_version,
            cuda_driver=info.cuda_driver,
            models=tuple(models),
        )

    def sample(
        self, node: str, session: int, seq: int, replica_map: Mapping[int, str] | None = None
    ) -> GpuBatch:
        """Read every GPU now; ``replica_map`` says which replica each GPU index serves.

        Blocks (about 45 ms per GPU with PCIe counters, a few ms without): call it from one
        worker thread at a time, e.g. ``asyncio.to_thread``. A GPU count NVML will not give is
        a TelemetryError; everything that goes wrong with one GPU stays in that GPU's entry.
        """
        ts = self._wall_clock()
        gpus = self._per_gpu(self._sample_one, replica_map or {})
        return GpuBatch(
            node=node, session=session, seq=seq, ts=ts, period_s=self.period_s, gpus=gpus
        )

    def _started(self) -> Any:
        if self._nvml is None:
            raise TelemetryError("the NVML sampler is not started; call init() first")
        return self._nvml

    def _per_gpu(self, read_one: Callable[[int, Any], Any], extra: Any) -> tuple[Any, ...]:
        nvml = self._started()
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise TelemetryError(f"NVML could not count the GPUs: {_describe(exc)}") from None
        self.field_errors = {}
        return tuple(read_one(index, extra) for index in range(min(count, MAX_GPUS)))

    def _sample_one(self, index: int, replica_map: Mapping[int, str]) -> GpuSample:
        replica = replica_map.get(index)
        errors = self.field_errors.setdefault(index, {})
        try:
            read = self._reader(index, errors)
            if read is None:
                return GpuSample(index=index, replica=replica, error=errors["handle"])
            sample = _read_gpu(read, index, replica, self.read_pcie)
        except _GpuLostError as lost:
            uuid, name = self._identity.get(index, (None, None))
            return GpuSample(index, uuid, name, replica=replica, lost=True, error=lost.reason)
        self._identity[index] = (sample.uuid, sample.name)
        return sample

    def _inventory_one(self, index: int, _: None) -> GpuInventory:
        errors = self.field_errors.setdefault(index, {})
        try:
            read = self._reader(index, errors)
            if read is None:
                return GpuInventory(index=index)
            uuid = _text(read.call("nvmlDeviceGetUUID", fields=("uuid",)))
            name = _text(read.call("nvmlDeviceGetName", fields=("name",)))
            memory = _memory(read)
            total = read.keep("memory_total_mib", None if memory is None else memory.total // MIB)
        except _GpuLostError:
            return GpuInventory(index=index, lost=True)
        self._identity[index] = (uuid, name)
        return GpuInventory(index=index, uuid=uuid, name=name, memory_total_mib=total)

    def _reader(self, index: int, errors: dict[str, str]) -> _Reader | None:
        """A reader for GPU ``index``; None (reason in errors) if NVML gives no handle."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            if _is_lost(nvml, exc):
                raise _GpuLostError(_describe(exc)) from None
            errors["handle"] = _describe(exc)
            return None
        return _Reader(nvml, handle, errors)


class _Reader:
    """Reads one device's fields, each on its own, keeping why a field is missing."""

    def __init__(self, nvml: Any, handle: Any, errors: dict[str, str], prefix: str = "") -> None:
        self.nvml = nvml
        self.handle = handle
        self.errors = errors
        self.prefix = prefix
        self.last_code: int | None = None
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError)
        self._catch: tuple[type[BaseException], ...] = (nvml.NVMLError, mismatch)

    def call(self, fn: str, *args: Any, fields: tuple[str, ...], bare: bool = False) -> Any:
        """``nvml.<fn>(handle, *args)``, or None if it failed; _GpuLostError if the GPU is gone."""
        self.last_code = None
        try:
            call_args = args if bare else (self.handle, *args)
            return getattr(self.nvml, fn)(*call_args)
        except self._catch as exc:
            if _is_lost(self.nvml, exc):
                raise _GpuLostError(_describe(exc)) from None
            self.last_code = getattr(exc, "value", None)
            for name in fields:
                self.errors[self.prefix + name] = _describe(exc)
            return None

    def keep(self, name: str, raw: Any, convert: Callable[[int], float] = int) -> Any:
        """``convert(raw)`` if NVML had a value and it is in the schema's range, else None."""
        if raw is None:
            return None
        if int(raw) in _NOT_AVAILABLE:
            self.errors[self.prefix + name] = "not available"
            return None
        value = convert(int(raw))
        lo, hi = INT_RANGES.get(name) or NUMBER_RANGES[name]
        if not lo <= value <= hi:
            self.errors[self.prefix + name] = f"{value} is outside {lo}..{hi}"
            return None
        return value

    def field(self, name: str, fn: str, *args: Any, convert: Callable[[int], float] = int) -> Any:
        return self.keep(name, self.call(fn, *args, fields=(name,)), convert)

    def newest(self, calls: Sequence[tuple[Any, ...]], fields: tuple[str, ...]) -> Any:
        """The first of ``calls`` (function name, args...) that this pynvml and driver know."""
        known = [c for c in calls if hasattr(self.nvml, c[0])]
        for n, (fn, *args) in enumerate(known):
            value = self.call(fn, *args, fields=fields)
            if n == len(known) - 1 or self.last_code not in _too_old(self.nvml):
                return value
            for name in fields:
                self.errors.pop(self.prefix + name, None)
        return None


def _read_gpu(read: _Reader, index: int, replica: str | None, pcie: bool) -> GpuSample:
    nvml = read.nvml
    util = read.call("nvmlDeviceGetUtilizationRates", fields=("gpu_util_pct", "mem_util_pct"))
    memory = _memory(read)
    return GpuSample(
        index=index,
        uuid=_text(read.call("nvmlDeviceGetUUID", fields=("uuid",))),
        name=_text(read.call("nvmlDeviceGetName", fields=("name",))),
        gpu_util_pct=read.keep("gpu_util_pct", None if util is None else util.gpu),
        mem_util_pct=read.keep("mem_util_pct", None if util is None else util.memory),
        fb_used_mib=read.keep("fb_used_mib", None if memory is None else memory.used // MIB),
        fb_total_mib=read.keep("fb_total_mib", None if memory is None else memory.total // MIB),
        power_w=read.field("power_w", "nvmlDeviceGetPowerUsage", convert=_milli),
        power_limit_w=read.field(
            "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", convert=_milli
        ),
        temp_c=_temperature(read),
        sm_clock_mhz=read.field("sm_clock_mhz", "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM),
        pcie_tx_kib_s=_pcie(read, "pcie_tx_kib_s", nvml.NVML_PCIE_UTIL_TX_BYTES) if pcie else None,
        pcie_rx_kib_s=_pcie(read, "pcie_rx_kib_s", nvml.NVML_PCIE_UTIL_RX_BYTES) if pcie else None,
        replica=replica,
        mig=_mig_devices(read),
        processes=_processes(read),
    )


def _pcie(read: _Reader, name: str, counter: int) -> Any:
    """PCIe throughput; NVML counts bytes for 20 ms, so each call blocks about 20 ms."""
    return read.field(name, "nvmlDeviceGetPcieThroughput", counter)


def _temperature(read: _Reader) -> Any:
    """GPU temperature: nvmlDeviceGetTemperatureV where the driver has it, else the old call."""
    sensor = read.nvml.NVML_TEMPERATURE_GPU
    calls = [("nvmlDeviceGetTemperatureV", sensor), ("nvmlDeviceGetTemperature", sensor)]
    return read.keep("temp_c", read.newest(calls, fields=("temp_c",)))


def _memory(read: _Reader) -> Any:
    """Memory info, v2 where the driver has it: its ``used`` leaves out driver-reserved memory,
    as nvidia-smi and DCGM do; v1 counts it as used."""
    calls: list[tuple[Any, ...]] = [("nvmlDeviceGetMemoryInfo",)]
    if hasattr(read.nvml, "nvmlMemory_v2"):
        calls.insert(0, ("nvmlDeviceGetMemoryInfo", read.nvml.nvmlMemory_v2))
    return read.newest(calls, fields=("fb_used_mib", "fb_total_mib"))


def _mig_devices(read: _Reader) -> tuple[MigDevice, ...] | None:
    """The MIG devices of a GPU in MIG mode; None when MIG is off or not supported."""
    nvml = read.nvml
    mode = read.call("nvmlDeviceGetMigMode", fields=("mig",))
    if mode is None or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    slots = read.call("nvmlDeviceGetMaxMigDeviceCount", fields=("mig",))
    devices: list[MigDevice] = []
    for slot in range(min(int(slots or 0), MAX_MIG_DEVICES)):
        handle = read.call("nvmlDeviceGetMigDeviceHandleByIndex", slot, fields=(f"mig[{slot}]",))
        if handle is None:
            if read.last_code == nvml.NVML_ERROR_NOT_FOUND:  # an empty slot, not a problem
                read.errors.pop(f"{read.prefix}mig[{slot}]", None)
            continue
        devices.append(_mig_device(_Reader(nvml, handle, read.errors, f"mig[{slot}]."), slot))
    return tuple(devices)


def _mig_device(read: _Reader, slot: int) -> MigDevice:
    memory = _memory(read)
    return MigDevice(
        index=slot,
        uuid=_text(read.call("nvmlDeviceGetUUID", fields=("uuid",))),
        gpu_instance_id=read.field("gpu_instance_id", "nvmlDeviceGetGpuInstanceId"),
        compute_instance_id=read.field("compute_instance_id", "nvmlDeviceGetComputeInstanceId"),
        fb_used_mib=read.keep("fb_used_mib", None if memory is None else memory.used // MIB),
        fb_total_mib=read.keep("fb_total_mib", None if memory is None else memory.total // MIB),
    )


def _processes(read: _Reader) -> tuple[ProcessInfo, ...] | None:
    """Compute processes (an inference server is one), at most MAX_PROCESSES of them."""
    procs = read.call("nvmlDeviceGetComputeRunningProcesses", fields=("processes",))
    if procs is None:
        return None
    out: list[ProcessInfo] = []
    for proc in list(procs)[:MAX_PROCESSES]:
        used: Any = getattr(proc, "usedGpuMemory", None)  # None when the driver cannot tell
        used_mib = None if used is None or used in _NOT_AVAILABLE else int(used) // MIB
        out.append(ProcessInfo(pid=int(proc.pid), used_mib=used_mib))
    return tuple(out)


def _milli(value: int) -> float:
    return value / 1000


def _text(value: Any) -> str | None:
    """NVML strings come as str or bytes (by pynvml version); clean and bounded."""
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return _CONTROL.sub("", text)[:MAX_TEXT]


def _too_old(nvml: Any) -> tuple[int, int]:
    """Codes that mean this driver lacks a newer call, so the older one is worth a try."""
    return (nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


def _is_lost(nvml: Any, exc: BaseException) -> bool:
    codes = (nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED)
    return getattr(exc, "value", None) in codes


def _describe(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # NVMLError.__str__ asks the library, which may be the broken part
        return f"NVML error {getattr(exc, 'value', '?')}"


def _init_message(nvml: Any, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    hint = next((h for k, h in _INIT_HINTS.items() if getattr(nvml, k, None) == code), None)
    return f"NVML is not available: {_describe(exc)}" + (f" ({hint})" if hint else "")


def _import_pynvml() -> Any:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailableError("NVML is not available: nvidia-ml-py is not installed") from None


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def reading(sampler: NvmlSampler, node: str) -> dict[str, object]:
    """One reading with everything worth knowing about it, for people to read."""
    status = sampler.birth(node, session=0, agent_version=_version("gpurouter"))
    started = time.perf_counter()
    batch = sampler.sample(node, session=0, seq=0)
    sample_ms = (time.perf_counter() - started) * 1000
    out: dict[str, object] = {
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "system_errors": sampler.system_errors,
        "status": as_json(status),
        "gpus": as_json(batch),
        "unread_fields": {str(i): e for i, e in sampler.field_errors.items() if e},
        "sample_ms": round(sample_ms, 2),
    }
    try:
        out["payload_bytes"] = {"status": len(encode(status)), "gpus": len(encode(batch))}
        out["valid"] = True
    except PayloadError as exc:
        out["valid"] = f"no: {exc.reason}"
    return out


def main(argv: Sequence[str] | None = None, *, nvml: Any = None) -> int:
    """Print the birth inventory and one GPU reading; exit 2 when NVML is unavailable."""
    parser = argparse.ArgumentParser(
        prog="python -m router.telemetry.nvml_sampler",
        description="Print this node's GPU inventory and one NVML reading as JSON.",
    )
    parser.add_argument("--node", default=socket.gethostname(), help="node name to report")
    args = parser.parse_args(argv)
    try:
        with NvmlSampler(nvml) as sampler:
            report = reading(sampler, args.node)
    except NvmlUnavailableError as exc:
        print(f"gpurouter: {exc}", file=sys.stderr)
        return 2
    except TelemetryError as exc:
        print(f"gpurouter: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if report["valid"] is True else 1


if __name__ == "__main__":
    sys.exit(main())
