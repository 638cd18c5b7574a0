"""Small fleets built in code, for tests that need no YAML."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import replace

from router.config.schema import (
    FleetConfig,
    GpuConfig,
    HealthConfig,
    NodeConfig,
    QueueConfig,
    ReplicaConfig,
    RetryConfig,
    RouterConfig,
    ServerConfig,
    StrategyConfig,
)

TWO_CARD_YAML = """\
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: n0
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: V100-32GB, memory_gib: 32}
    replicas:
      - {id: a100, endpoint: "http://127.0.0.1:18001", gpus: [0]}
      - {id: v100, endpoint: "http://127.0.0.1:18002", gpus: [1]}
"""
"""A fleet file with one A100 and one V100 (endpoints are placeholders): the CLI tests'."""


def make_fleet(
    weights: Sequence[float] = (2.0, 2.0, 1.0, 1.0),
    batch_sizes: Sequence[int] | None = None,
    *,
    strategy: str = "weighted-least-connections",
    queue_size: int = 1024,
    attempts: int = 3,
    kv_capacity: Sequence[int | None] | None = None,
    tiers: Sequence[str] | None = None,
) -> FleetConfig:
    """One node, one GPU per replica; heavier replicas are called A100s, the rest V100s."""
    n = len(weights)
    batch_sizes = batch_sizes or [4] * n
    kv_capacity = kv_capacity or [None] * n
    tiers = tiers or ["strong" if w > 1 else "standard" for w in weights]
    gpus = tuple(GpuConfig(i, _gpu(w), 80.0) for i, w in enumerate(weights))
    replicas = tuple(
        ReplicaConfig(
            id=f"r{i}",
            node="node-0",
            endpoint=f"http://127.0.0.1:{18000 + i}",
            model="test-model",
            gpus=(i,),
            gpu_model=_gpu(weights[i]),
            weight=weights[i],
            batch_size=batch_sizes[i],
            tier=tiers[i],
            kv_capacity_tokens=kv_capacity[i],
        )
        for i in range(n)
    )
    return FleetConfig(
        nodes=(NodeConfig("node-0", gpus, replicas),),
        cluster="test",
        router=RouterConfig(
            strategy=StrategyConfig(strategy),
            queue=QueueConfig(size=queue_size, default_deadline_s=30.0),
            retries=RetryConfig(attempts=attempts),
        ),
    )


def _gpu(weight: float) -> str:
    return "A100-80GB" if weight > 1 else "V100-32GB"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def served_behind(
    fleet: FleetConfig, health: HealthConfig, endpoints: Mapping[str, str] | None = None
) -> FleetConfig:
    """``fleet`` (one node) with each replica at ``endpoints[id]``, or at a closed loopback
    port, the router's listeners on free loopback ports and ``health`` its checks."""
    node = fleet.nodes[0]
    at = endpoints or {}
    replicas = tuple(
        replace(r, endpoint=at.get(r.id, f"http://127.0.0.1:{closed_port()}"))
        for r in node.replicas
    )
    return replace(
        fleet,
        nodes=(replace(node, replicas=replicas),),
        router=replace(fleet.router, health=health),
        server=ServerConfig(listen="127.0.0.1:0", admin_listen="127.0.0.1:0"),
    )
