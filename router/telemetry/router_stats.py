"""What a router publishes about itself on ``routers/<router>/stats``, written and read here.

Each router with a control link (``gpurouter serve``) publishes, every second, its strategy,
queue, requests in flight, throughput, imbalance factor and, per replica, its state, load and
settings. :func:`encode_stats` writes the message from a snapshot; :func:`decode_stats` reads
one back for whoever watches the cluster (``gpurouter console --broker``) and refuses, with a
:class:`~router.telemetry.schema.PayloadError` naming the field, anything else: the payload
comes off a broker anyone on the cluster's network may publish to.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from router.snapshot import FleetSnapshot
from router.telemetry.control_messages import CONTROL_VERSION
from router.telemetry.schema import PayloadError

__all__ = ["MAX_STATS_BYTES", "ReplicaStats", "RouterStats", "decode_stats", "encode_stats"]

STATS_VERSION = CONTROL_VERSION
MAX_STATS_BYTES = 256 * 1024
"""Larger stats are refused unread (a router of 1,000 replicas writes about 130 KiB)."""
MAX_REPLICAS = 4096
MAX_NAME = 128
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One replica as its router saw it."""

    id: str
    state: str
    in_flight: int
    weight: float
    batch_size: int
    utilization: float
    stale: bool


@dataclass(frozen=True, slots=True)
class RouterStats:
    """One ``routers/<router>/stats`` message."""

    router: str
    ts: float
    """The router's wall clock when it wrote the message (shown, never used to age it)."""
    strategy: str
    queue_depth: int
    queue_capacity: int
    in_flight: int
    throughput_rps: float
    imbalance_factor: float
    replicas: tuple[ReplicaStats, ...]


def encode_stats(
    snap: FleetSnapshot, router: str, ts: float, load: dict[str, object] | None = None
) -> bytes:
    """The stats message of ``router`` from its snapshot, with its own share of each
    replica's load for its peers (router/peer_load.py) when given."""
    replicas = [
        {
            "id": r.id,
            "state": r.state,
            "in_flight": r.in_flight,
            "weight": r.weight,
            "batch_size": r.batch_size,
            "utilization": round(r.utilization, 4),
            "stale": r.stale,
        }
        for r in snap.replicas
    ]
    body: dict[str, Any] = {
        "v": STATS_VERSION,
        "router": router,
        "ts": ts,
        "strategy": snap.strategy,
        "queue": {"depth": snap.queue.depth, "capacity": snap.queue.capacity},
        "in_flight": snap.in_flight,
        "throughput_rps": round(snap.throughput_rps, 3),
        "imbalance_factor": round(snap.imbalance_factor, 4),
        "replicas": replicas,
    }
    if load is not None:
        body["load"] = load
    return json.dumps(body, separators=(",", ":")).encode()


def decode_stats(payload: object) -> RouterStats:
    """A stats message read and checked; PayloadError says what is wrong with it."""
    if not isinstance(payload, bytes | bytearray):
        raise PayloadError(f"payload: expected bytes, got {type(payload).__name__}")
    if len(payload) > MAX_STATS_BYTES:
        raise PayloadError(f"payload: {len(payload)} bytes, over {MAX_STATS_BYTES}")
    try:
        body = json.loads(payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"payload: not JSON: {str(exc)[:120]}") from None
    top = _object(body, "payload")
    if _field(top, "v", int) != STATS_VERSION:
        raise PayloadError(f"v: expected {STATS_VERSION}")
    queue = _object(top.get("queue"), "queue")
    replicas = _field(top, "replicas", list)
    if len(replicas) > MAX_REPLICAS:
        raise PayloadError(f"replicas: {len(replicas)} entries, over {MAX_REPLICAS}")
    return RouterStats(
        router=_name(top, "router"),
        ts=_number(top, "ts"),
        strategy=_name(top, "strategy"),
        queue_depth=_count(queue, "depth"),
        queue_capacity=_count(queue, "capacity"),
        in_flight=_count(top, "in_flight"),
        throughput_rps=_number(top, "throughput_rps"),
        imbalance_factor=_number(top, "imbalance_factor"),
        replicas=tuple(_replica(_object(r, f"replicas[{i}]")) for i, r in enumerate(replicas)),
    )


def _replica(o: dict[str, Any]) -> ReplicaStats:
    return ReplicaStats(
        id=_name(o, "id"),
        state=_name(o, "state"),
        in_flight=_count(o, "in_flight"),
        weight=_number(o, "weight"),
        batch_size=_count(o, "batch_size"),
        utilization=_number(o, "utilization"),
        stale=_field(o, "stale", bool),
    )


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected an object")
    return value


def _field(o: dict[str, Any], key: str, kind: type[T]) -> T:
    value = o.get(key)
    # bool is an int to Python, never to this schema.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise PayloadError(f"{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _name(o: dict[str, Any], key: str) -> str:
    value = _field(o, key, str)
    if not value or len(value) > MAX_NAME or not value.isprintable():
        raise PayloadError(f"{key}: {value[:40]!r} is not a name")
    return value


def _count(o: dict[str, Any], key: str) -> int:
    value = _field(o, key, int)
    if value < 0:
        raise PayloadError(f"{key}: {value} is negative")
    return value


def _number(o: dict[str, Any], key: str) -> float:
    value = o.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PayloadError(f"{key}: expected a finite number")
    return float(value)
