"""Pools, requests and bookkeeping for strategy tests, done the way the router core does it.

The core adds a request to ``replica.running``, adds its cost to ``outstanding_cost`` and then
calls ``pool.changed``; completion undoes both. Strategies see only that, so these helpers are
all a strategy test needs: no core, no clock, no sockets.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.config.schema import ReplicaConfig
from router.pool import ReplicaPool
from router.replica import Replica, ReplicaState
from router.request import Request, estimate_cost
from router.strategies import Strategy, create_strategy

_ids = itertools.count()


@dataclass(frozen=True)
class Spec:
    """One replica of a test fleet."""

    weight: float = 1.0
    batch_size: int = 32
    tier: str = "standard"
    kv_capacity_tokens: int | None = None
    max_context_tokens: int | None = None


def config(i: int, spec: Spec) -> ReplicaConfig:
    return ReplicaConfig(
        id=f"r{i}",
        node=f"node-{i // 8}",
        endpoint=f"http://127.0.0.1:{18000 + i}",
        model="test-model",
        gpus=(0,),
        gpu_model="A100-80GB" if spec.weight > 1 else "V100-32GB",
        weight=spec.weight,
        batch_size=spec.batch_size,
        tier=spec.tier,
        kv_capacity_tokens=spec.kv_capacity_tokens,
        max_context_tokens=spec.max_context_tokens,
    )


def make_pool(specs: Sequence[Spec]) -> ReplicaPool:
    return ReplicaPool([config(i, s) for i, s in enumerate(specs)])


def weighted_pool(weights: Sequence[float], batch_size: int = 32) -> ReplicaPool:
    return make_pool([Spec(weight=w, batch_size=batch_size) for w in weights])


def attach(
    name: str,
    pool: ReplicaPool,
    params: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> Strategy:
    """A registered strategy attached to the pool as the core attaches it (as its listener)."""
    return attach_strategy(create_strategy(name, params, random.Random(seed)), pool)


def attach_strategy(strategy: Strategy, pool: ReplicaPool) -> Strategy:
    strategy.attach(pool)
    pool.listener = strategy.update
    return strategy


def request(
    prompt_tokens: int = 100,
    max_tokens: int = 100,
    *,
    key: str | None = None,
    avoid: set[int] | None = None,
) -> Request:
    """A request with its cost set, as the core sets it before routing."""
    return Request(
        id=f"q{next(_ids)}",
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        arrival=0.0,
        affinity_key=key,
        cost=estimate_cost(prompt_tokens, max_tokens),
        avoid=set() if avoid is None else avoid,
    )


def dispatch(pool: ReplicaPool, replica: Replica, req: Request) -> None:
    replica.running[req.id] = req
    replica.own_cost += req.cost
    pool.changed(replica)


def complete(pool: ReplicaPool, replica: Replica, req: Request) -> None:
    del replica.running[req.id]
    replica.own_cost -= req.cost
    if not replica.running:
        replica.own_cost = 0.0  # no float residue once idle
    pool.changed(replica)


def set_state(pool: ReplicaPool, replica: Replica, state: ReplicaState) -> None:
    replica.state = state
    pool.changed(replica)


def set_weight(pool: ReplicaPool, replica: Replica, weight: float) -> None:
    replica.weight = weight
    pool.changed(replica)


def pick_and_run(strategy: Strategy, req: Request, now: float = 0.0) -> Replica | None:
    """Pick for a request and complete it at once: a schedule with no load building up."""
    r = strategy.pick(req, now)
    if r is not None:
        dispatch(strategy.pool, r, req)
        complete(strategy.pool, r, req)
    return r


def sequence(strategy: Strategy, picks: int) -> list[str]:
    """Ids chosen for ``picks`` identical requests, each completed before the next."""
    out = []
    for _ in range(picks):
        r = pick_and_run(strategy, request())
        assert r is not None
        out.append(r.id)
    return out
