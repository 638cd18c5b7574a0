"""Short histories the dashboard draws as sparklines, fed once per refresh."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GPU_POINTS = 16
"""Utilization samples kept per GPU (the table's sparkline shows the newest few)."""
REPLICA_POINTS = 120
"""Latency samples kept per replica for its detail view (two minutes at 1 Hz)."""


@dataclass(slots=True)
class ReplicaHistory:
    ttft_p50: deque[float] = field(default_factory=lambda: deque(maxlen=REPLICA_POINTS))
    ttft_p99: deque[float] = field(default_factory=lambda: deque(maxlen=REPLICA_POINTS))
    e2e_p50: deque[float] = field(default_factory=lambda: deque(maxlen=REPLICA_POINTS))
    throughput: deque[float] = field(default_factory=lambda: deque(maxlen=REPLICA_POINTS))


class History:
    """Per-GPU utilization and per-replica latency, newest last."""

    def __init__(self) -> None:
        self.gpu: dict[str, deque[float]] = {}
        self.replica: dict[str, ReplicaHistory] = {}

    def add_gpus(self, utilization: Mapping[str, float]) -> None:
        for key, value in utilization.items():
            points = self.gpu.get(key)
            if points is None:
                points = self.gpu[key] = deque(maxlen=GPU_POINTS)
            points.append(value)

    def add_replica(
        self,
        replica: str,
        ttft_p50: float | None,
        ttft_p99: float | None,
        e2e_p50: float | None,
        throughput: float,
    ) -> None:
        h = self.replica.get(replica)
        if h is None:
            h = self.replica[replica] = ReplicaHistory()
        # A replica with no completion yet has no latency; zero keeps the timeline aligned.
        h.ttft_p50.append(ttft_p50 or 0.0)
        h.ttft_p99.append(ttft_p99 or 0.0)
        h.e2e_p50.append(e2e_p50 or 0.0)
        h.throughput.append(throughput)

    def gpu_points(self, key: str) -> Iterable[float]:
        return self.gpu.get(key, ())
