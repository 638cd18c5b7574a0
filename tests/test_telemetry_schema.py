"""Telemetry payloads: round trips, every validation rule, and fuzzing of the decoders."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.control import Drain
from router.errors import TelemetryError
from router.telemetry import (
    MAX_PAYLOAD_BYTES,
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
from router.telemetry.control_topics import decode_desired, slot_of
from router.telemetry.schema import INT_RANGES, NUMBER_RANGES

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=400)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "telemetry.md"

H100 = GpuSample(
    index=0,
    uuid="GPU-228d2ebe-8a85-b43f-752c-195faa5b335b",
    name="NVIDIA H100 80GB HBM3",
    gpu_util_pct=87,
    mem_util_pct=41.5,
    fb_used_mib=71230,
    fb_total_mib=81559,
    power_w=512.349,
    power_limit_w=700.0,
    temp_c=63,
    sm_clock_mhz=1980,
    pcie_tx_kib_s=2067,
    pcie_rx_kib_s=542,
    replica="h100-0",
    mig=(MigDevice(0, "MIG-1", 1, 0, 19000, 40192),),
    processes=(ProcessInfo(4242, 70750), ProcessInfo(4243)),
)
BATCH = GpuBatch(
    node="gpu-node-07",
    session=12,
    seq=3071,
    ts=1718003071.125,
    period_s=1.0,
    gpus=(H100, GpuSample(index=1, uuid="GPU-2", lost=True, error="GPU is lost")),
)
STATUS = NodeStatus(
    node="gpu-node-07",
    state="online",
    session=12,
    agent_version="0.1.0",
    sample_period_s=1.0,
    gpus=(GpuInventory(0, "GPU-1", "NVIDIA H100 80GB HBM3", 81559), GpuInventory(1, lost=True)),
    ts=1718000000.125,
    driver="580.159.04",
    nvml_version="13.580.159.04",
    cuda_driver="13.0",
    models=("meta-llama/Llama-3.1-8B-Instruct",),
)


def payload(obj: dict[str, Any]) -> bytes:
    """JSON as a careless or hostile sender might write it (NaN allowed, ASCII escapes)."""
    return json.dumps(obj).encode()


def changed(obj: GpuBatch | NodeStatus, path: tuple[str | int, ...], value: object) -> bytes:
    """``obj`` as JSON with the value at ``path`` replaced (or deleted, for DELETE)."""
    data = copy.deepcopy(as_json(obj))
    *parents, last = path
    node: Any = data
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return payload(data)


DELETE = object()


# -- round trips --------------------------------------------------------------------------


def test_a_batch_round_trips() -> None:
    assert decode_gpus(encode(BATCH)) == BATCH


def test_a_status_round_trips() -> None:
    assert decode_status(encode(STATUS)) == STATUS
    offline = NodeStatus("n", "offline", 1, "0.1.0", 1.0, (), 5.0)
    assert decode_status(encode(offline)) == offline


def test_encoding_is_compact_json_with_the_version_first() -> None:
    data = encode(BATCH)
    assert data.startswith(b'{"v":1,"node":"gpu-node-07",')
    assert b": " not in data
    assert b", " not in data


def test_absent_values_are_left_out_but_replica_is_written_as_null() -> None:
    batch = GpuBatch("n", 1, 0, 1.0, 1.0, (GpuSample(index=0),))
    assert json.loads(encode(batch))["gpus"] == [{"index": 0, "replica": None}]


def test_the_examples_in_the_docs_are_valid_payloads() -> None:
    blocks = re.findall(r"```json\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 5
    status, batch, desired, ack, stats = (block.encode() for block in blocks)
    assert decode_status(status).gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert decode_gpus(batch).gpus[1].lost
    assert decode_desired(desired).command == Drain("a100-0")
    assert json.loads(ack)["slot"] == slot_of(Drain("a100-0"))
    assert json.loads(stats)["replicas"][0]["id"] == "a100-0"


def test_unknown_keys_are_ignored_so_agents_can_add_optional_fields() -> None:
    data: Any = as_json(BATCH)
    data["future"] = {"anything": [1, 2]}
    data["gpus"][0]["nvlink_tx_kib_s"] = 5
    assert decode_gpus(payload(data)) == BATCH


def test_null_means_absent_for_optional_fields() -> None:
    data: Any = as_json(GpuBatch("n", 1, 0, 1.0, 1.0, (GpuSample(index=0),)))
    data["gpus"][0] |= {"uuid": None, "temp_c": None, "mig": None, "lost": None}
    assert decode_gpus(payload(data)).gpus[0] == GpuSample(index=0)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_any_bytes_like_payload_is_accepted(kind: Callable[[bytes], Any]) -> None:
    assert decode_gpus(kind(encode(BATCH))) == BATCH


def test_a_payload_error_is_a_telemetry_error_with_a_reason() -> None:
    with pytest.raises(PayloadError) as caught:
        decode_gpus(b"{}")
    assert isinstance(caught.value, TelemetryError)
    assert caught.value.reason == "v: expected 1, got None"


# -- every rule ---------------------------------------------------------------------------

BATCH_RULES: list[tuple[tuple[str | int, ...], object, str]] = [
    (("v",), 2, "v: expected 1, got 2"),
    (("v",), "1", "v: expected 1, got '1'"),
    (("v",), True, "v: expected 1, got True"),
    (("v",), DELETE, "v: expected 1, got None"),
    (("node",), DELETE, "node: missing"),
    (("node",), "", "node: '' cannot be a topic level"),
    (("node",), "rack/7", "node: 'rack/7' cannot be a topic level"),
    (("node",), "node+", "node: 'node+' cannot be a topic level"),
    (("node",), "n" * 129, "node: 129 characters, over 128"),
    (("node",), 7, "node: expected a string, got an integer (7)"),
    (("session",), "1", "session: expected an integer, got a string"),
    (("session",), 1.0, "session: expected an integer, got a number (1.0)"),
    (("session",), True, "session: expected an integer, got a boolean"),
    (("session",), -1, "session: -1 is outside 0..9223372036854775807"),
    (("session",), 2**63, "session: 9223372036854775808 is outside"),
    (("seq",), DELETE, "seq: missing"),
    (("seq",), None, "seq: missing"),
    (("seq",), math.inf, "payload: not JSON: Infinity is not a number JSON allows"),
    (("ts",), -1, "ts: -1 is outside 0..10000000000.0"),
    (("ts",), "now", "ts: expected a finite number, got a string"),
    (("ts",), math.nan, "payload: not JSON: NaN is not a number JSON allows"),
    (("period_s",), 0, "period_s: must be above 0"),
    (("period_s",), -0.5, "period_s: -0.5 is outside 0..3600"),
    (("period_s",), 3601, "period_s: 3601 is outside 0..3600"),
    (("gpus",), {}, "gpus: expected a list, got an object"),
    (("gpus",), [1], "gpus[0]: expected an object, got an integer (1)"),
    (("gpus",), [{"index": i} for i in range(65)], "gpus: 65 entries, over 64"),
    (("gpus", 0, "index"), DELETE, "gpus[0].index: missing"),
    (("gpus", 0, "index"), 1024, "gpus[0].index: 1024 is outside 0..1023"),
    (("gpus", 1, "index"), 0, "gpus: GPU index 0 appears twice"),
    (("gpus", 0, "gpu_util_pct"), 100.5, "gpus[0].gpu_util_pct: 100.5 is outside 0..100"),
    (("gpus", 0, "gpu_util_pct"), -0.1, "gpus[0].gpu_util_pct: -0.1 is outside 0..100"),
    (("gpus", 0, "gpu_util_pct"), "50", "gpus[0].gpu_util_pct: expected a finite number"),
    (("gpus", 0, "mem_util_pct"), 101, "gpus[0].mem_util_pct: 101 is outside 0..100"),
    (("gpus", 0, "mem_util_pct"), False, "gpus[0].mem_util_pct: expected a finite number"),
    (("gpus", 0, "fb_used_mib"), -1, "gpus[0].fb_used_mib: -1 is outside 0..1000000000"),
    (("gpus", 0, "fb_used_mib"), 1.5, "gpus[0].fb_used_mib: expected an integer"),
    (("gpus", 0, "fb_total_mib"), 10**9 + 1, "gpus[0].fb_total_mib: 1000000001 is outside"),
    (("gpus", 0, "power_w"), -1, "gpus[0].power_w: -1 is outside 0..100000"),
    (("gpus", 0, "power_limit_w"), "700", "gpus[0].power_limit_w: expected a finite number"),
    (("gpus", 0, "temp_c"), 201, "gpus[0].temp_c: 201 is outside -50..200"),
    (("gpus", 0, "sm_clock_mhz"), -1, "gpus[0].sm_clock_mhz: -1 is outside 0..100000"),
    (("gpus", 0, "pcie_tx_kib_s"), 10**9 + 1, "gpus[0].pcie_tx_kib_s: 1000000001 is outside"),
    (("gpus", 0, "pcie_rx_kib_s"), [], "gpus[0].pcie_rx_kib_s: expected an integer, got a list"),
    (("gpus", 0, "uuid"), 5, "gpus[0].uuid: expected a string, got an integer"),
    (("gpus", 0, "name"), "x" * 257, "gpus[0].name: 257 characters, over 256"),
    (("gpus", 0, "name"), "H100\x00", "gpus[0].name: has control characters or lone surrogates"),
    (("gpus", 0, "name"), "H100\ud800", "gpus[0].name: has control characters or lone surrogates"),
    (("gpus", 0, "replica"), "r" * 129, "gpus[0].replica: 129 characters, over 128"),
    (("gpus", 0, "lost"), "yes", "gpus[0].lost: expected true or false, got a string"),
    (("gpus", 0, "error"), 5, "gpus[0].error: expected a string"),
    (("gpus", 0, "mig"), {}, "gpus[0].mig: expected a list, got an object"),
    (("gpus", 0, "mig"), [{"index": 0}] * 17, "gpus[0].mig: 17 entries, over 16"),
    (("gpus", 0, "mig", 0, "index"), DELETE, "gpus[0].mig[0].index: missing"),
    (("gpus", 0, "mig", 0, "gpu_instance_id"), -1, "gpus[0].mig[0].gpu_instance_id: -1 is"),
    (("gpus", 0, "mig", 0, "fb_used_mib"), "1", "gpus[0].mig[0].fb_used_mib: expected an integer"),
    (("gpus", 0, "processes"), [{"pid": 1}] * 129, "gpus[0].processes: 129 entries, over 128"),
    (("gpus", 0, "processes", 0), "4242", "gpus[0].processes[0]: expected an object"),
    (("gpus", 0, "processes", 0, "pid"), "x", "gpus[0].processes[0].pid: expected an integer"),
    (("gpus", 0, "processes", 0, "pid"), 2**32, "gpus[0].processes[0].pid: 4294967296 is"),
    (("gpus", 0, "processes", 0, "used_mib"), -5, "gpus[0].processes[0].used_mib: -5 is"),
]


@pytest.mark.parametrize(("path", "value", "reason"), BATCH_RULES)
def test_a_batch_breaking_a_rule_is_refused_with_the_reason(
    path: tuple[str | int, ...], value: object, reason: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        decode_gpus(changed(BATCH, path, value))
    assert caught.value.reason.startswith(reason)


STATUS_RULES: list[tuple[tuple[str | int, ...], object, str]] = [
    (("state",), "sleeping", "state: expected 'online' or 'offline', got 'sleeping'"),
    (("state",), DELETE, "state: missing"),
    (("agent_version",), DELETE, "agent_version: missing"),
    (("agent_version",), "v" * 129, "agent_version: 129 characters, over 128"),
    (("sample_period_s",), 0, "sample_period_s: must be above 0"),
    (("gpus",), DELETE, "gpus: missing"),
    (("gpus", 0, "memory_total_mib"), -1, "gpus[0].memory_total_mib: -1 is outside"),
    (("gpus", 1, "index"), 0, "gpus: GPU index 0 appears twice"),
    (("gpus", 1, "lost"), 1, "gpus[1].lost: expected true or false, got an integer"),
    (("driver",), 550, "driver: expected a string, got an integer"),
    (("cuda_driver",), "1" * 129, "cuda_driver: 129 characters, over 128"),
    (("models",), "llama", "models: expected a list, got a string"),
    (("models",), [1], "models[0]: expected a string, got an integer"),
    (("models",), ["m"] * 65, "models: 65 entries, over 64"),
    (("ts",), DELETE, "ts: missing"),
    (("session",), -1, "session: -1 is outside"),
    (("node",), "a#b", "node: 'a#b' cannot be a topic level"),
]


@pytest.mark.parametrize(("path", "value", "reason"), STATUS_RULES)
def test_a_status_breaking_a_rule_is_refused_with_the_reason(
    path: tuple[str | int, ...], value: object, reason: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        decode_status(changed(STATUS, path, value))
    assert caught.value.reason.startswith(reason)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "payload: not JSON"),
        (b"\xff\xfe", "payload: not UTF-8"),
        (b"[]", "payload: expected an object, got a list"),
        (b'"gpus"', "payload: expected an object, got a string"),
        (b"null", "payload: expected an object, got null"),
        (b" " * (MAX_PAYLOAD_BYTES + 1), f"payload: {MAX_PAYLOAD_BYTES + 1} bytes, over 65536"),
        (b"[" * 30_000, "payload: nested too deeply"),
        (b'{"v":1,"node":"a","node":"b"}', "payload: not JSON: duplicate key"),
        (b'{"v":Infinity}', "payload: not JSON: Infinity is not a number JSON allows"),
        (b'{"v":' + b"1" * 5000 + b"}", "payload: not JSON: Exceeds the limit"),
    ],
)
def test_bytes_that_are_not_a_payload_are_refused_with_the_reason(data: bytes, reason: str) -> None:
    for decode in (decode_gpus, decode_status):
        with pytest.raises(PayloadError) as caught:
            decode(data)
        assert caught.value.reason.startswith(reason)


def test_a_number_too_big_for_a_float_is_refused() -> None:
    """JSON reads 1e999 as infinity, which is no count and no measurement."""
    with pytest.raises(PayloadError, match=r"seq: expected an integer, got a number \(inf\)"):
        decode_gpus(encode(BATCH).replace(b'"seq":3071', b'"seq":1e999'))
    with pytest.raises(PayloadError, match=r"ts: expected a finite number, got a number \(inf\)"):
        decode_gpus(encode(BATCH).replace(b'"ts":1718003071.125', b'"ts":1e999'))


@pytest.mark.parametrize("value", ["text", None, 1, 1.5, {"v": 1}])
def test_a_payload_that_is_not_bytes_is_refused(value: object) -> None:
    with pytest.raises(PayloadError, match="payload: expected bytes"):
        decode_gpus(value)


@pytest.mark.parametrize(
    "obj",
    [
        GpuBatch("n", 1, 0, 1.0, 1.0, (GpuSample(index=0, gpu_util_pct=150),)),
        GpuBatch("n", 1, 0, 1.0, 1.0, (GpuSample(index=0, power_w=math.nan),)),
        GpuBatch("rack/7", 1, 0, 1.0, 1.0, ()),
        GpuBatch("n", 1, 0, 1.0, 1.0, (GpuSample(index=0, name="\ud800"),)),
        NodeStatus("n", "online", 1, "0.1.0", 0.0, (), 1.0),
    ],
)
def test_encode_refuses_what_a_receiver_would_drop(obj: GpuBatch | NodeStatus) -> None:
    with pytest.raises(PayloadError):
        encode(obj)


def test_encode_refuses_a_batch_over_the_size_limit() -> None:
    procs = tuple(ProcessInfo(pid, 1000) for pid in range(128))
    gpus = tuple(GpuSample(index=i, processes=procs) for i in range(64))
    with pytest.raises(PayloadError, match="over 65536"):
        encode(GpuBatch("n", 1, 0, 1.0, 1.0, gpus))


# -- properties and fuzzing ---------------------------------------------------------------

text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=40)


def ints(key: str) -> st.SearchStrategy[int]:
    return st.integers(*INT_RANGES[key])


def numbers(key: str) -> st.SearchStrategy[float]:
    lo, hi = NUMBER_RANGES[key]
    return st.integers(int(lo), int(hi)) | st.floats(lo, hi)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


node_names = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/+#"),
    min_size=1,
    max_size=20,
)
processes = st.builds(ProcessInfo, ints("pid"), maybe(ints("used_mib")))
migs = st.builds(
    MigDevice,
    st.integers(0, 6),
    maybe(text),
    maybe(ints("gpu_instance_id")),
    maybe(ints("compute_instance_id")),
    maybe(ints("fb_used_mib")),
    maybe(ints("fb_total_mib")),
)
samples = st.builds(
    GpuSample,
    index=ints("index"),
    uuid=maybe(text),
    name=maybe(text),
    gpu_util_pct=maybe(numbers("gpu_util_pct")),
    mem_util_pct=maybe(numbers("mem_util_pct")),
    fb_used_mib=maybe(ints("fb_used_mib")),
    power_w=maybe(numbers("power_w")),
    temp_c=maybe(ints("temp_c")),
    pcie_rx_kib_s=maybe(ints("pcie_rx_kib_s")),
    replica=maybe(text),
    mig=maybe(st.lists(migs, max_size=3).map(tuple)),
    processes=maybe(st.lists(processes, max_size=3).map(tuple)),
    lost=st.booleans(),
    error=maybe(text),
)
batches = st.builds(
    GpuBatch,
    node=node_names,
    session=ints("session"),
    seq=ints("seq"),
    ts=numbers("ts"),
    period_s=st.floats(0.001, 3600),
    gpus=st.lists(samples, max_size=4, unique_by=lambda g: g.index).map(tuple),
)
statuses = st.builds(
    NodeStatus,
    node=node_names,
    state=st.sampled_from(["online", "offline"]),
    session=ints("session"),
    agent_version=text,
    sample_period_s=st.integers(1, 60),
    gpus=st.lists(
        st.builds(
            GpuInventory, ints("index"), maybe(text), maybe(text), maybe(ints("fb_used_mib"))
        ),
        max_size=4,
        unique_by=lambda g: g.index,
    ).map(tuple),
    ts=numbers("ts"),
    driver=maybe(text),
    models=st.lists(text, max_size=3).map(tuple),
)


@FUZZ
@given(batches)
def test_any_valid_batch_round_trips(batch: GpuBatch) -> None:
    assert decode_gpus(encode(batch)) == batch


@FUZZ
@given(statuses)
def test_any_valid_status_round_trips(status: NodeStatus) -> None:
    assert decode_status(encode(status)) == status


def decodes_or_refuses(data: bytes) -> None:
    """Either a payload comes out (and encodes back to itself) or PayloadError: nothing else."""
    for decode in (decode_gpus, decode_status):
        try:
            result = decode(data)
        except PayloadError:
            continue
        assert decode(encode(result)) == result


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_only_ever_raise_payload_error(data: bytes) -> None:
    decodes_or_refuses(data)


PAYLOAD_CLASSES = (GpuBatch, NodeStatus, GpuSample, GpuInventory, MigDevice, ProcessInfo)
KEYS = sorted({"v"} | {f.name for cls in PAYLOAD_CLASSES for f in fields(cls)})
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=6)
    ),
    max_leaves=25,
)


@FUZZ
@given(json_values)
def test_arbitrary_json_only_ever_raises_payload_error(value: object) -> None:
    decodes_or_refuses(json.dumps(value).encode())


@FUZZ
@given(st.sampled_from([BATCH, STATUS]), st.data())
def test_a_valid_payload_with_any_value_swapped_only_raises_payload_error(
    obj: GpuBatch | NodeStatus, data: st.DataObject
) -> None:
    """Replace one value, anywhere in a real payload, with arbitrary JSON."""
    doc: Any = as_json(obj)
    parent = doc
    while True:
        keys = list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        key = data.draw(st.sampled_from(keys))
        child = parent[key]
        if not isinstance(child, dict | list) or not child or data.draw(st.booleans()):
            break
        parent = child
    parent[key] = data.draw(json_values)
    decodes_or_refuses(json.dumps(doc).encode())
