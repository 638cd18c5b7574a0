"""Telemetry payloads, version 1: what a node agent publishes and every receiver accepts.

Two messages (docs/telemetry.md shows both):

- :class:`NodeStatus` on ``nodes/<node>/status``: the birth (``online``) or last word
  (``offline``) of an agent, with its GPU inventory.
- :class:`GpuBatch` on ``nodes/<node>/gpus``: one reading of every GPU of a node.

:func:`encode` writes compact JSON; :func:`decode_gpus` and :func:`decode_status` check every
key they know (type, range, length) and raise :class:`PayloadError`, and nothing else, for any
input at all. A value the agent could not read is absent (``None`` here). Keys a decoder does
not know are ignored, so agents can gain optional fields before receivers do; a change of
meaning or a removed field is a new ``v``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from router.errors import TelemetryError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SCHEMA_VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_GPUS = 64
MAX_MIG_DEVICES = 16
MAX_PROCESSES = 128
MAX_MODELS = 64
MAX_TEXT = 256
MAX_NAME = 128

INT_RANGES: dict[str, tuple[int, int]] = {
    "index": (0, 1023),
    "fb_used_mib": (0, 10**9),
    "fb_total_mib": (0, 10**9),
    "memory_total_mib": (0, 10**9),
    "temp_c": (-50, 200),
    "sm_clock_mhz": (0, 100_000),
    "pcie_tx_kib_s": (0, 10**9),
    "pcie_rx_kib_s": (0, 10**9),
    "gpu_instance_id": (0, 1023),
    "compute_instance_id": (0, 1023),
    "pid": (0, 2**32 - 1),
    "used_mib": (0, 10**9),
    "session": (0, 2**63 - 1),
    "seq": (0, 2**63 - 1),
}
"""Inclusive bounds of the integer fields, by key; the sampler drops readings outside them."""

NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "gpu_util_pct": (0, 100),
    "mem_util_pct": (0, 100),
    "power_w": (0, 100_000),
    "power_limit_w": (0, 100_000),
    "ts": (0, 1e10),
}
"""Inclusive bounds of the fields that may be fractional (int or float), by key."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TOPIC_CHARS = re.compile(r"[/+#]")


class PayloadError(TelemetryError):
    """A telemetry payload was malformed; ``reason`` says where and how."""

    title = "bad telemetry payload"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A compute process on a GPU."""

    pid: int
    """Process id, as the host's kernel numbers it."""
    used_mib: int | None = None
    """GPU memory the process holds, MiB."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a slice of a GPU in MIG mode)."""

    index: int
    """Slot of the MIG device on its parent GPU."""
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    fb_used_mib: int | None = None
    fb_total_mib: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU; a field the card could not report is None."""

    index: int
    uuid: str | None = None
    name: str | None = None
    gpu_util_pct: float | None = None
    mem_util_pct: float | None = None
    fb_used_mib: int | None = None
    fb_total_mib: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: int | None = None
    sm_clock_mhz: int | None = None
    pcie_tx_kib_s: int | None = None
    pcie_rx_kib_s: int | None = None
    replica: str | None = None
    """The replica this GPU serves; written as null when none."""
    mig: tuple[MigDevice, ...] | None = None
    """MIG devices; None when MIG mode is off or not supported."""
    processes: tuple[ProcessInfo, ...] | None = None
    """Compute processes; None when they could not be listed."""
    lost: bool = False
    """The GPU fell off the bus (or needs a reset); the other readings are absent."""
    error: str | None = None
    """Why the GPU could not be read, when it could not."""


@dataclass(frozen=True, slots=True)
class GpuBatch:
    """Every GPU of a node at one instant: the ``nodes/<node>/gpus`` message."""

    node: str
    session: int
    """Grows with each connect of the agent; a new value means the agent restarted."""
    seq: int
    """Sample number within the session; a gap means lost samples."""
    ts: float
    """Unix time of the reading, seconds (the agent's clock: for display, not for ageing)."""
    period_s: float
    """Seconds between samples."""
    gpus: tuple[GpuSample, ...]


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """A GPU as the birth message lists it."""

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    lost: bool = False


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """An agent's birth or last word: the retained ``nodes/<node>/status`` message."""

    node: str
    state: Literal["online", "offline"]
    session: int
    agent_version: str
    sample_period_s: float
    gpus: tuple[GpuInventory, ...]
    ts: float
    driver: str | None = None
    """NVIDIA driver version, e.g. ``550.54.15``; None on emulated nodes."""
    nvml_version: str | None = None
    cuda_driver: str | None = None
    """Highest CUDA version the driver supports, e.g. ``12.4``."""
    models: tuple[str, ...] = ()
    """Models the node's replicas serve."""


Payload = GpuBatch | NodeStatus


def encode(obj: Payload) -> bytes:
    """Compact UTF-8 JSON for ``obj``; PayloadError if a receiver would refuse it."""
    try:
        text = json.dumps(as_json(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        data = text.encode("utf-8")
    except (ValueError, TypeError) as exc:  # NaN, a lone surrogate, a value JSON cannot carry
        raise PayloadError(f"cannot encode {type(obj).__name__}: {exc}") from None
    (decode_gpus if isinstance(obj, GpuBatch) else decode_status)(data)
    return data


def as_json(obj: Payload) -> dict[str, object]:
    """The JSON object for ``obj``: ``v`` first, absent values left out, ``replica`` kept."""
    return {"v": SCHEMA_VERSION, **_object(obj)}


def _object(obj: DataclassInstance) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.name != "replica":
            continue
        if f.name in ("lost", "models") and not value:
            continue
        if isinstance(value, tuple):
            value = [
                _object(v) if is_dataclass(v) and not isinstance(v, type) else v for v in value
            ]
        out[f.name] = value
    return out


def decode_gpus(payload: object) -> GpuBatch:
    """Parse and check a ``gpus`` message (bytes); PayloadError says what is wrong."""
    top = _Obj(_load(payload), "")
    gpus = top.items("gpus", MAX_GPUS, _objects(_gpu_sample))
    _unique_indexes(gpus)
    return GpuBatch(
        node=top.node(),
        session=top.integer("session"),
        seq=top.integer("seq"),
        ts=top.number("ts"),
        period_s=top.period("period_s"),
        gpus=gpus,
    )


def decode_status(payload: object) -> NodeStatus:
    """Parse and check a ``status`` message (bytes); PayloadError says what is wrong."""
    top = _Obj(_load(payload), "")
    state = top.text("state")
    if state not in ("online", "offline"):
        raise PayloadError(f"state: expected 'online' or 'offline', got {_short(state)}")
    gpus = top.items("gpus", MAX_GPUS, _objects(_inventory))
    _unique_indexes(gpus)
    models = top.opt_items("models", MAX_MODELS, lambda v, path: _text(v, path, MAX_NAME))
    return NodeStatus(
        node=top.node(),
        state="online" if state == "online" else "offline",
        session=top.integer("session"),
        agent_version=top.text("agent_version", MAX_NAME),
        sample_period_s=top.period("sample_period_s"),
        gpus=gpus,
        ts=top.number("ts"),
        driver=top.opt_text("driver", MAX_NAME),
        nvml_version=top.opt_text("nvml_version", MAX_NAME),
        cuda_driver=top.opt_text("cuda_driver", MAX_NAME),
        models=models or (),
    )


def _gpu_sample(o: _Obj) -> GpuSample:
    return GpuSample(
        index=o.integer("index"),
        uuid=o.opt_text("uuid"),
        name=o.opt_text("name"),
        gpu_util_pct=o.opt_number("gpu_util_pct"),
        mem_util_pct=o.opt_number("mem_util_pct"),
        fb_used_mib=o.opt_integer("fb_used_mib"),
        fb_total_mib=o.opt_integer("fb_total_mib"),
        power_w=o.opt_number("power_w"),
        power_limit_w=o.opt_number("power_limit_w"),
        temp_c=o.opt_integer("temp_c"),
        sm_clock_mhz=o.opt_integer("sm_clock_mhz"),
        pcie_tx_kib_s=o.opt_integer("pcie_tx_kib_s"),
        pcie_rx_kib_s=o.opt_integer("pcie_rx_kib_s"),
        replica=o.opt_text("replica", MAX_NAME),
        mig=o.opt_items("mig", MAX_MIG_DEVICES, _objects(_mig_device)),
        processes=o.opt_items("processes", MAX_PROCESSES, _objects(_process)),
        lost=o.flag("lost"),
        error=o.opt_text("error"),
    )


def _mig_device(o: _Obj) -> MigDevice:
    return MigDevice(
        index=o.integer("index"),
        uuid=o.opt_text("uuid"),
        gpu_instance_id=o.opt_integer("gpu_instance_id"),
        compute_instance_id=o.opt_integer("compute_instance_id"),
        fb_used_mib=o.opt_integer("fb_used_mib"),
        fb_total_mib=o.opt_integer("fb_total_mib"),
    )


def _process(o: _Obj) -> ProcessInfo:
    return ProcessInfo(pid=o.integer("pid"), used_mib=o.opt_integer("used_mib"))


def _inventory(o: _Obj) -> GpuInventory:
    return GpuInventory(
        index=o.integer("index"),
        uuid=o.opt_text("uuid"),
        name=o.opt_text("name"),
        memory_total_mib=o.opt_integer("memory_total_mib"),
        lost=o.flag("lost"),
    )


def _load(payload: object) -> object:
    """Bytes to a JSON value; every way this can fail becomes a PayloadError."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise PayloadError(f"payload: expected bytes, got {type(payload).__name__}")
    data = bytes(payload)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(f"payload: {len(data)} bytes, over {MAX_PAYLOAD_BYTES}")
    try:
        text = data.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise PayloadError("payload: not UTF-8") from None
    except RecursionError:
        raise PayloadError("payload: nested too deeply") from None
    except ValueError as exc:  # bad JSON, NaN, a duplicate key, an integer too long
        raise PayloadError(f"payload: not JSON: {str(exc)[:120]}") from None
    if isinstance(value, dict):
        v = value.get("v")
        if type(v) is not int or v != SCHEMA_VERSION:
            raise PayloadError(f"v: expected {SCHEMA_VERSION}, got {_short(v)}")
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")
    return out


def _unique_indexes(gpus: tuple[GpuSample, ...] | tuple[GpuInventory, ...]) -> None:
    seen: set[int] = set()
    for gpu in gpus:
        if gpu.index in seen:
            raise PayloadError(f"gpus: GPU index {gpu.index} appears twice")
        seen.add(gpu.index)


T = TypeVar("T")
Item = Callable[[object, str], T]
_ABSENT = object()


def _objects(build: Callable[[_Obj], T]) -> Item[T]:
    """A list-entry reader for entries that are objects."""
    return lambda value, path: build(_Obj(value, path))


class _Obj:
    """A JSON object being checked, with its path for error messages."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise PayloadError(f"{path or 'payload'}: expected an object, got {_kind(value)}")
        self._d: dict[str, object] = value
        self._path = path

    def at(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def get(self, key: str) -> object:
        """A required value (null counts as missing)."""
        value = self._d.get(key)
        if value is None:
            raise PayloadError(f"{self.at(key)}: missing")
        return value

    def integer(self, key: str) -> int:
        return _int(self.get(key), self.at(key), INT_RANGES[key])

    def opt_integer(self, key: str) -> int | None:
        value = self._d.get(key)
        return None if value is None else _int(value, self.at(key), INT_RANGES[key])

    def number(self, key: str) -> float:
        return _num(self.get(key), self.at(key), NUMBER_RANGES[key])

    def opt_number(self, key: str) -> float | None:
        value = self._d.get(key)
        return None if value is None else _num(value, self.at(key), NUMBER_RANGES[key])

    def period(self, key: str) -> float:
        value = _num(self.get(key), self.at(key), (0, 3600))
        if value == 0:
            raise PayloadError(f"{self.at(key)}: must be above 0")
        return value

    def flag(self, key: str) -> bool:
        value = self._d.get(key)
        if value is None or isinstance(value, bool):
            return value is True
        raise PayloadError(f"{self.at(key)}: expected true or false, got {_kind(value)}")

    def text(self, key: str, limit: int = MAX_TEXT) -> str:
        return _text(self.get(key), self.at(key), limit)

    def opt_text(self, key: str, limit: int = MAX_TEXT) -> str | None:
        value = self._d.get(key)
        return None if value is None else _text(value, self.at(key), limit)

    def node(self) -> str:
        name = self.text("node", MAX_NAME)
        if not name or _TOPIC_CHARS.search(name):
            raise PayloadError(f"node: {_short(name)} cannot be a topic level (empty, / + #)")
        return name

    def items(self, key: str, limit: int, item: Item[T]) -> tuple[T, ...]:
        return _list(self.get(key), self.at(key), limit, item)

    def opt_items(self, key: str, limit: int, item: Item[T]) -> tuple[T, ...] | None:
        value = self._d.get(key)
        return None if value is None else _list(value, self.at(key), limit, item)


def _list(value: object, path: str, limit: int, item: Item[T]) -> tuple[T, ...]:
    if not isinstance(value, list):
        raise PayloadError(f"{path}: expected a list, got {_kind(value)}")
    if len(value) > limit:
        raise PayloadError(f"{path}: {len(value)} entries, over {limit}")
    return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))


def _int(value: object, path: str, bounds: tuple[int, int]) -> int:
    if type(value) is not int:
        raise PayloadError(f"{path}: expected an integer, got {_kind(value)}")
    _in_range(value, path, bounds)
    return value


def _num(value: object, path: str, bounds: tuple[float, float]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PayloadError(f"{path}: expected a finite number, got {_kind(value)}")
    _in_range(value, path, bounds)
    return value


def _in_range(value: float, path: str, bounds: tuple[float, float]) -> None:
    lo, hi = bounds
    if not lo <= value <= hi:
        raise PayloadError(f"{path}: {_short(value)} is outside {lo}..{hi}")


def _text(value: object, path: str, limit: int) -> str:
    if not isinstance(value, str):
        raise PayloadError(f"{path}: expected a string, got {_kind(value)}")
    if len(value) > limit:
        raise PayloadError(f"{path}: {len(value)} characters, over {limit}")
    if _CONTROL.search(value) or _SURROGATE.search(value):
        raise PayloadError(f"{path}: has control characters or lone surrogates")
    return value


def _kind(value: object) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    kinds |= {list: "a list", dict: "an object", type(None): "null"}
    return f"{kinds.get(type(value), type(value).__name__)} ({_short(value)})"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
