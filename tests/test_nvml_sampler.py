"""The NVML sampler, against a stand-in NVML that fails the way the real one does."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Iterator

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.errors import TelemetryError
from router.telemetry import (
    GpuInventory,
    GpuSample,
    MigDevice,
    NvmlSampler,
    NvmlUnavailableError,
    ProcessInfo,
    decode_gpus,
    decode_status,
    encode,
)
from router.telemetry.nvml_sampler import main
from router.telemetry.schema import MAX_PROCESSES
from tests.fake_nvml import GIB, MIB, FakeGpu, FakeMig, FakeNvml

UUID_B = "GPU-bbbbbbbb-2222-3333-4444-555555555555"
FIELDS = [
    "gpu_util_pct",
    "mem_util_pct",
    "fb_used_mib",
    "fb_total_mib",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "pcie_tx_kib_s",
    "pcie_rx_kib_s",
]


def clock() -> float:
    return 1_700_000_000.25


def start(nvml: FakeNvml, *, period_s: float = 1.0, read_pcie: bool = True) -> NvmlSampler:
    sampler = NvmlSampler(nvml, wall_clock=clock, period_s=period_s, read_pcie=read_pcie)
    sampler.init()
    return sampler


@pytest.fixture
def two_gpus() -> FakeNvml:
    return FakeNvml([FakeGpu(), FakeGpu(uuid=UUID_B, name="NVIDIA A100-SXM4-80GB")])


@pytest.fixture
def sampler(two_gpus: FakeNvml) -> Iterator[NvmlSampler]:
    with NvmlSampler(two_gpus, wall_clock=clock, period_s=0.5) as s:
        yield s


def test_the_fake_has_pynvml_signatures() -> None:
    """Each function the fake offers takes the same parameters as the real pynvml one."""
    fake = FakeNvml()
    names = [n for n in dir(FakeNvml) if n.startswith("nvml")]
    assert len(names) >= 20
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        mine = inspect.signature(getattr(fake, name))
        assert [p.name for p in mine.parameters.values()] == list(real.parameters), name


def test_pynvml_maps_an_error_code_to_its_subclass() -> None:
    """The fake relies on pynvml.NVMLError(code) building the subclass for that code."""
    exc = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert isinstance(exc, pynvml.NVMLError_NotSupported)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), pynvml.NVMLError_GpuIsLost)


def test_a_healthy_gpu_reads_every_field_in_dcgm_units(sampler: NvmlSampler) -> None:
    """Bytes become MiB, milliwatts watts; used memory leaves out driver-reserved memory."""
    gpu = sampler.sample("node-a", 3, 7).gpus[0]
    assert gpu == GpuSample(
        index=0,
        uuid="GPU-11111111-2222-3333-4444-555555555555",
        name="NVIDIA H100 80GB HBM3",
        gpu_util_pct=87,
        mem_util_pct=41,
        fb_used_mib=60 * 1024,
        fb_total_mib=80 * 1024,
        power_w=312.5,
        power_limit_w=700.0,
        temp_c=61,
        sm_clock_mhz=1980,
        pcie_tx_kib_s=1200,
        pcie_rx_kib_s=3400,
        processes=(),
    )


def test_a_batch_carries_node_session_seq_period_and_the_injected_time(
    sampler: NvmlSampler,
) -> None:
    batch = sampler.sample("node-a", 3, 7)
    assert (batch.node, batch.session, batch.seq, batch.period_s) == ("node-a", 3, 7, 0.5)
    assert batch.ts == clock()
    assert [g.index for g in batch.gpus] == [0, 1]


def test_the_replica_map_names_the_replica_each_gpu_serves(sampler: NvmlSampler) -> None:
    batch = sampler.sample("node-a", 1, 0, {1: "a100-0"})
    assert [g.replica for g in batch.gpus] == [None, "a100-0"]


@pytest.mark.parametrize(
    ("function", "missing"),
    [
        ("nvmlDeviceGetUtilizationRates", {"gpu_util_pct", "mem_util_pct"}),
        ("nvmlDeviceGetMemoryInfo", {"fb_used_mib", "fb_total_mib"}),
        ("nvmlDeviceGetPowerUsage", {"power_w"}),
        ("nvmlDeviceGetEnforcedPowerLimit", {"power_limit_w"}),
        ("nvmlDeviceGetTemperatureV", {"temp_c"}),
        ("nvmlDeviceGetClockInfo", {"sm_clock_mhz"}),
        ("nvmlDeviceGetPcieThroughput", {"pcie_tx_kib_s", "pcie_rx_kib_s"}),
    ],
)
def test_an_unsupported_field_is_left_out_and_the_rest_still_read(
    function: str, missing: set[str]
) -> None:
    gpu = FakeGpu(errors={function: pynvml.NVML_ERROR_NOT_SUPPORTED})
    sampler = start(FakeNvml([gpu]))
    sample = sampler.sample("n", 1, 0).gpus[0]
    absent = {f for f in FIELDS if getattr(sample, f) is None}
    assert absent == missing
    assert not sample.lost
    assert {k: v for k, v in sampler.field_errors[0].items() if k in FIELDS} == dict.fromkeys(
        missing, "Not Supported"
    )


def test_any_nvml_error_on_a_field_is_left_out_not_raised() -> None:
    """No permission, unknown error, timeouts: the field is absent, the sample goes on."""
    errors = {
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NO_PERMISSION,
        "nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_UNKNOWN,
        "nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_TIMEOUT,
    }
    sampler = start(FakeNvml([FakeGpu(errors=errors)]))
    sample = sampler.sample("n", 1, 0).gpus[0]
    assert (sample.power_w, sample.sm_clock_mhz, sample.processes) == (None, None, None)
    assert sample.gpu_util_pct == 87
    assert sampler.field_errors[0]["power_w"] == "Insufficient Permissions"


def test_a_gpu_that_falls_off_the_bus_is_reported_lost_and_the_others_still_read(
    two_gpus: FakeNvml,
) -> None:
    sampler = start(two_gpus)
    sampler.sample("n", 1, 0)
    two_gpus.gpus[1].lost = True
    lost = sampler.sample("n", 1, 1).gpus
    assert lost[0].gpu_util_pct == 87
    assert lost[1] == GpuSample(
        index=1, uuid=UUID_B, name="NVIDIA A100-SXM4-80GB", lost=True, error="GPU is lost"
    )
    assert sampler.sample("n", 1, 2).gpus[1].lost  # and the sampler keeps going


def test_a_gpu_lost_in_the_middle_of_a_reading_is_reported_lost() -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST})
    sample = start(FakeNvml([gpu])).sample("n", 1, 0, {0: "h100-0"}).gpus[0]
    assert sample.lost
    assert sample.replica == "h100-0"
    assert sample.gpu_util_pct is None


def test_a_gpu_needing_a_reset_counts_as_lost() -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetUUID": pynvml.NVML_ERROR_RESET_REQUIRED})
    sample = start(FakeNvml([gpu])).sample("n", 1, 0).gpus[0]
    assert sample.lost
    assert sample.error == "GPU requires restart"


def test_a_gpu_without_a_handle_is_reported_with_the_reason() -> None:
    gpu = FakeGpu(errors={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_NO_PERMISSION})
    sample = start(FakeNvml([gpu, FakeGpu()])).sample("n", 1, 0).gpus
    assert sample[0] == GpuSample(index=0, error="Insufficient Permissions")
    assert sample[1].gpu_util_pct == 87


def test_failing_to_count_gpus_is_a_telemetry_error() -> None:
    nvml = FakeNvml(system_errors={"nvmlDeviceGetCount": pynvml.NVML_ERROR_UNKNOWN})
    with pytest.raises(TelemetryError, match="could not count the GPUs: Unknown Error"):
        start(nvml).sample("n", 1, 0)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver installed"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
    ],
)
def test_nvml_that_cannot_start_raises_a_clear_unavailable_error(code: int, words: str) -> None:
    sampler = NvmlSampler(FakeNvml(init_error=code))
    with pytest.raises(NvmlUnavailableError, match=words) as caught:
        sampler.init()
    assert isinstance(caught.value, TelemetryError)
    assert str(caught.value).startswith("NVML is not available: ")


def test_the_context_manager_starts_and_stops_nvml_once() -> None:
    nvml = FakeNvml()
    with NvmlSampler(nvml) as sampler:
        sampler.init()  # a second init is harmless
        assert nvml.init_count == 1
    assert nvml.init_count == 0
    sampler.shutdown()  # and so is a second shutdown
    assert nvml.calls.count("nvmlShutdown") == 1


def test_using_the_sampler_before_init_is_a_telemetry_error() -> None:
    with pytest.raises(TelemetryError, match="not started"):
        NvmlSampler(FakeNvml()).sample("n", 1, 0)


def test_mig_devices_are_listed_when_mig_is_enabled() -> None:
    migs = {0: FakeMig("MIG-a", 1, 0), 3: FakeMig("MIG-b", 2, 0, used_bytes=0)}
    gpu = FakeGpu(mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE, mig=migs)
    sampler = start(FakeNvml([gpu]))
    assert sampler.sample("n", 1, 0).gpus[0].mig == (
        MigDevice(0, "MIG-a", 1, 0, fb_used_mib=1024, fb_total_mib=10 * 1024),
        MigDevice(3, "MIG-b", 2, 0, fb_used_mib=0, fb_total_mib=10 * 1024),
    )
    assert sampler.field_errors[0] == {}  # empty MIG slots are not errors


@pytest.mark.parametrize("mode", [None, 0])
def test_mig_is_absent_when_off_or_unsupported(mode: int | None) -> None:
    sample = start(FakeNvml([FakeGpu(mig_mode=mode)])).sample("n", 1, 0).gpus[0]
    assert sample.mig is None


def test_processes_list_pid_and_memory_and_unknown_memory_is_absent() -> None:
    gpu = FakeGpu(processes=[(4242, 20 * GIB), (4243, None)])
    sample = start(FakeNvml([gpu])).sample("n", 1, 0).gpus[0]
    assert sample.processes == (ProcessInfo(4242, 20 * 1024), ProcessInfo(4243))


def test_processes_are_capped_to_what_the_schema_allows() -> None:
    gpu = FakeGpu(processes=[(pid, MIB) for pid in range(MAX_PROCESSES + 10)])
    sample = start(FakeNvml([gpu])).sample("n", 1, 0).gpus[0]
    assert sample.processes is not None
    assert len(sample.processes) == MAX_PROCESSES


@pytest.mark.parametrize("how", ["driver lacks it", "pynvml lacks it"])
def test_temperature_falls_back_to_the_older_nvml_call(how: str) -> None:
    if how == "driver lacks it":
        code = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
        nvml = FakeNvml([FakeGpu(errors={"nvmlDeviceGetTemperatureV": code})])
    else:
        nvml = FakeNvml(without=("nvmlDeviceGetTemperatureV",))
    sampler = start(nvml)
    assert sampler.sample("n", 1, 0).gpus[0].temp_c == 61
    assert "nvmlDeviceGetTemperature" in nvml.calls
    assert "temp_c" not in sampler.field_errors[0]


def test_memory_falls_back_to_v1_which_counts_reserved_memory_as_used() -> None:
    code = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    gpu = FakeGpu(errors={"nvmlDeviceGetMemoryInfo_v2": code})
    sample = start(FakeNvml([gpu])).sample("n", 1, 0).gpus[0]
    assert sample.fb_used_mib == 60 * 1024 + 512


def test_a_value_nvml_marks_not_available_is_left_out() -> None:
    sampler = start(FakeNvml([FakeGpu(temp_c=0xFFFFFFFF)]))
    assert sampler.sample("n", 1, 0).gpus[0].temp_c is None
    assert sampler.field_errors[0]["temp_c"] == "not available"


def test_a_value_outside_the_schema_range_is_left_out_so_the_batch_stays_valid() -> None:
    sampler = start(FakeNvml([FakeGpu(gpu_util=150)]))
    batch = sampler.sample("n", 1, 0)
    assert batch.gpus[0].gpu_util_pct is None
    assert sampler.field_errors[0]["gpu_util_pct"] == "150 is outside 0..100"
    assert decode_gpus(encode(batch)) == batch


def test_pcie_can_be_skipped_because_each_counter_blocks_20_ms() -> None:
    nvml = FakeNvml()
    sample = start(nvml, read_pcie=False).sample("n", 1, 0).gpus[0]
    assert (sample.pcie_tx_kib_s, sample.pcie_rx_kib_s) == (None, None)
    assert "nvmlDeviceGetPcieThroughput" not in nvml.calls


def test_birth_lists_versions_and_inventory(two_gpus: FakeNvml) -> None:
    status = start(two_gpus, period_s=2.0).birth("node-a", 5, "0.1.0", models=["llama-3-8b"])
    assert (status.state, status.session, status.sample_period_s) == ("online", 5, 2.0)
    assert (status.driver, status.nvml_version, status.cuda_driver) == (
        "550.54.15",
        "12.550.54.15",
        "12.4",
    )
    assert status.gpus[1] == GpuInventory(1, UUID_B, "NVIDIA A100-SXM4-80GB", 80 * 1024)
    assert status.models == ("llama-3-8b",)
    assert decode_status(encode(status)) == status


def test_a_version_nvml_will_not_give_is_absent_from_birth() -> None:
    code = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    nvml = FakeNvml(system_errors={"nvmlSystemGetCudaDriverVersion": code})
    sampler = start(nvml)
    status = sampler.birth("n", 1, "0.1.0")
    assert status.cuda_driver is None
    assert status.driver == "550.54.15"
    assert sampler.system_errors == {"cuda_driver": "Function Not Found"}


def test_a_lost_gpu_is_marked_in_the_inventory(two_gpus: FakeNvml) -> None:
    two_gpus.gpus[0].lost = True
    assert start(two_gpus).inventory()[0] == GpuInventory(0, lost=True)


fake_migs = st.builds(FakeMig, st.just("MIG-x"), st.integers(0, 9), st.integers(0, 9))
fake_gpus = st.builds(
    FakeGpu,
    name=st.text(max_size=300),
    gpu_util=st.integers(0, 2**32 - 1),
    used_bytes=st.integers(0, 80 * GIB),
    temp_c=st.integers(0, 2**32 - 1),
    power_mw=st.integers(0, 2**32 - 1),
    mig_mode=st.sampled_from([None, 0, 1]),
    mig=st.dictionaries(
        st.integers(0, 6),
        st.builds(FakeMig, st.just("MIG-x"), st.integers(0, 9), st.integers(0, 9)),
        max_size=7,
    ),
    processes=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.none() | st.integers(0, GIB))),
    errors=st.dictionaries(
        st.sampled_from(
            [
                "nvmlDeviceGetUUID",
                "nvmlDeviceGetName",
                "nvmlDeviceGetUtilizationRates",
                "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetPowerUsage",
                "nvmlDeviceGetTemperatureV",
                "nvmlDeviceGetPcieThroughput",
                "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetMigMode",
            ]
        ),
        st.sampled_from(
            [
                pynvml.NVML_ERROR_NOT_SUPPORTED,
                pynvml.NVML_ERROR_NO_PERMISSION,
                pynvml.NVML_ERROR_GPU_IS_LOST,
                pynvml.NVML_ERROR_UNKNOWN,
            ]
        ),
    ),
    lost=st.booleans(),
)


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(st.lists(fake_gpus, max_size=4))
def test_whatever_the_cards_do_the_batch_is_a_valid_payload(gpus: list[FakeGpu]) -> None:
    """Unsupported fields, lost cards, odd values: what the sampler makes always encodes."""
    sampler = start(FakeNvml(gpus))
    batch = sampler.sample("node-a", 1, 0)
    assert decode_gpus(encode(batch)) == batch
    status = sampler.birth("node-a", 1, "0.1.0")
    assert decode_status(encode(status)) == status


def test_the_command_prints_inventory_and_one_reading(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--node", "gpu-box"], nvml=FakeNvml()) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"]["node"] == "gpu-box"
    assert report["status"]["driver"] == "550.54.15"
    assert report["gpus"]["gpus"][0]["power_w"] == 312.5
    assert report["unread_fields"] == {"0": {"mig": "Not Supported"}}
    assert report["valid"] is True


def test_the_command_exits_2_with_one_line_when_nvml_is_unavailable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert main([], nvml=FakeNvml(init_error=code)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpurouter: NVML is not available: NVML Shared Library Not Found")


def test_importing_the_package_loads_neither_pynvml_nor_the_sampler() -> None:
    """So `python -m router.telemetry.nvml_sampler` runs the module fresh, and UIs stay light."""
    code = (
        "import sys, router.telemetry\n"
        "print(sorted(m for m in sys.modules if m in ('pynvml', 'router.telemetry.nvml_sampler')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"
