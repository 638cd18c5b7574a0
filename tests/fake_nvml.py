"""A stand-in for nvidia-ml-py's ``pynvml`` module: GPUs in memory, no driver needed.

It has the real module's function names and signatures (a test checks them), returns the
real struct types (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ...) in NVML's units (bytes,
milliwatts, KB/s), and fails the way NVML fails: by raising ``pynvml.NVMLError(code)``, which
pynvml turns into the matching subclass (``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``).
Constants, error classes and structs are the real ones from pynvml.
"""

# The methods carry pynvml's own camelCase names, so that the fake can stand in for it.
# ruff: noqa: N802

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

GIB = 1024**3
MIB = 1024**2

_FORWARDED = ("NVML_", "NVMLError", "NVMLLibraryMismatchError", "c_nvml", "nvmlMemory_v2")


@dataclass
class FakeMig:
    """A MIG device on a fake GPU."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    used_bytes: int = 1 * GIB
    total_bytes: int = 10 * GIB


@dataclass
class FakeGpu:
    """One fake GPU; values in NVML's own units. ``errors``: function name -> NVML error code."""

    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    name: str = "NVIDIA H100 80GB HBM3"
    gpu_util: int = 87
    mem_util: int = 41
    total_bytes: int = 80 * GIB
    used_bytes: int = 60 * GIB
    reserved_bytes: int = 512 * MIB
    power_mw: int = 312_500
    power_limit_mw: int = 700_000
    temp_c: int = 61
    sm_clock_mhz: int = 1980
    pcie_tx_kbs: int = 1_200
    pcie_rx_kbs: int = 3_400
    mig_mode: int | None = None
    """None: the card has no MIG; 0 disabled; 1 (NVML_DEVICE_MIG_ENABLE) enabled."""
    mig: dict[int, FakeMig] = field(default_factory=dict)
    """MIG devices by slot; the other slots are empty."""
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used bytes or None when the driver cannot tell)."""
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False
    """Fell off the bus: every call on it, the handle too, raises NVMLError_GpuIsLost."""


@dataclass(frozen=True)
class FakeHandle:
    """Opaque like ``c_nvmlDevice_t``: a GPU index, and a MIG slot for MIG devices."""

    index: int
    mig_slot: int | None = None


class FakeNvml:
    """The module object the sampler is given instead of pynvml."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        system_errors: dict[str, int] | None = None,
        without: tuple[str, ...] = (),
        driver: str = "550.54.15",
        nvml_version: str = "12.550.54.15",
        cuda_version: int = 12040,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.system_errors = system_errors or {}
        self.without = without
        """Functions this 'pynvml' lacks, as an older nvidia-ml-py would."""
        self.driver = driver
        self.nvml_version = nvml_version
        self.cuda_version = cuda_version
        self.init_count = 0
        self.calls: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "without"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(_FORWARDED) and name not in self.without:
            return getattr(pynvml, name)
        raise AttributeError(name)

    # -- library ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._system("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._system("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._system("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check(self.gpus[index], "nvmlDeviceGetHandleByIndex")
        return FakeHandle(index)

    # -- device -----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> bytes:
        gpu, mig = self._device(handle, "nvmlDeviceGetUUID")
        return (mig.uuid if mig else gpu.uuid).encode()  # bytes, as nvidia-ml-py 13 returns

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._device(handle, "nvmlDeviceGetName")[0].name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu, _ = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=gpu.gpu_util, memory=gpu.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        gpu, mig = self._device(handle, "nvmlDeviceGetMemoryInfo")
        if version and "nvmlDeviceGetMemoryInfo_v2" in gpu.errors:
            raise pynvml.NVMLError(gpu.errors["nvmlDeviceGetMemoryInfo_v2"])
        total = mig.total_bytes if mig else gpu.total_bytes
        used = mig.used_bytes if mig else gpu.used_bytes
        reserved = 0 if mig else gpu.reserved_bytes
        free = total - used - reserved
        if not version:  # v1 counts driver-reserved memory as used
            return pynvml.c_nvmlMemory_t(total=total, free=free, used=used + reserved)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=total, reserved=reserved, free=free, used=used
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._device(handle, "nvmlDeviceGetPowerUsage")[0].power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")[0].power_limit_mw

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        self._sensor(sensor)
        return self._device(handle, "nvmlDeviceGetTemperature")[0].temp_c

    def nvmlDeviceGetTemperatureV(
        self, handle: FakeHandle, sensor: int, version: int = pynvml.nvmlTemperature_v1
    ) -> int:
        self._sensor(sensor)
        if version != pynvml.nvmlTemperature_v1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._device(handle, "nvmlDeviceGetTemperatureV")[0].temp_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        gpu, _ = self._device(handle, "nvmlDeviceGetClockInfo")
        if type != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.sm_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        gpu, _ = self._device(device, "nvmlDeviceGetPcieThroughput")
        return gpu.pcie_tx_kbs if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbs

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        gpu, _ = self._device(device, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        gpu, _ = self._device(device, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        gpu, _ = self._device(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if index not in gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: FakeHandle) -> int:
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: FakeHandle) -> int:
        return self._mig(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu, _ = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0, "computeInstanceId": 0}
            )
            for pid, used in gpu.processes
        ]

    # -- failure modes ----------------------------------------------------------------------

    def _system(self, fn: str) -> None:
        self.calls.append(fn)
        if self.init_count <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if fn in self.system_errors:
            raise pynvml.NVMLError(self.system_errors[fn])

    def _check(self, gpu: FakeGpu, fn: str) -> None:
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[fn])

    def _device(self, handle: FakeHandle, fn: str) -> tuple[FakeGpu, FakeMig | None]:
        self._system(fn)
        gpu = self.gpus[handle.index]
        self._check(gpu, fn)
        return gpu, None if handle.mig_slot is None else gpu.mig[handle.mig_slot]

    def _mig(self, device: FakeHandle, fn: str) -> FakeMig:
        _, mig = self._device(device, fn)
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig

    def _sensor(self, sensor: int) -> None:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
