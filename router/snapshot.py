"""An immutable view of the whole router at one instant, for the console, ctl and metrics.

Readers never touch live router objects: they get plain frozen data, built in one pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from router.imbalance import Band, band, capacity_loads, counted, imbalance_factor
from router.replica import Replica, ReplicaState
from router.stats import percentile

if TYPE_CHECKING:
    from router.core import RouterCore


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    id: str
    node: str
    gpu_model: str
    gpus: tuple[int, ...]
    tier: str
    state: str
    weight: float
    static_weight: float
    weight_pinned: bool
    batch_size: int
    batch_pinned: bool
    in_flight: int
    outstanding_cost: float
    utilization: float
    utilization_from_telemetry: bool
    telemetry_age_s: float | None
    stale: bool
    """Telemetry was received once but is now older than 3 sample periods."""
    completed: int
    failed: int
    retries: int
    throughput_rps: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    node_online: bool | None = None
    """What the node's telemetry agent last said (None: no agent heard from)."""
    engine_waiting: int | None = None
    """Requests queued inside the replica's engine, from its /metrics."""
    engine_running: int | None = None
    kv_usage: float | None = None
    """The engine's KV-cache usage, 0..1, from its /metrics."""
    engine_age_s: float | None = None
    """Age of the engine's /metrics reading (None: never read)."""
    load: float = 0.0
    """Work sent to it per second (last 10 s) over its learned capacity (router/imbalance.py):
    1.0 is all it can do. What the imbalance factor compares over the active replicas."""
    capacity_rps: float = 0.0
    """Learned capacity, requests per second at the fleet's mean request (router/capacity.py)."""
    capacity_rate: float = 0.0
    """The same in cost units per second: what load-aware strategies divide load by."""
    capacity_source: str = "prior"
    """``prior`` (performance model or static weight), ``measured`` or ``operator``."""
    capacity_age_s: float | None = None
    """Seconds since a completion last refined it (None: never measured)."""
    capacity_prior_rps: float = 0.0
    capacity_measured_rps: float | None = None
    """What the router's accounting alone says (None: nothing completed yet)."""
    capacity_measured_concurrency: float | None = None
    """Requests at once that measurement speaks for, where short of the batch size: a card
    the performance model does not know, run only a few at a time (None: at the batch size,
    or nothing measured)."""
    kv_capacity_tokens: int | None = None
    """KV-cache size as learned; None: unknown."""
    kv_capacity_source: str | None = None
    """``engine`` (its /metrics), ``fleet file`` or ``prior`` (performance model)."""
    kv_capacity_age_s: float | None = None
    """Age of the engine reading behind it (None for the fleet file or the prior)."""
    engine_preemptions: int | None = None
    """The engine's cumulative preemption count, from its /metrics."""
    model: str = ""
    """The model the fleet file declares for it."""
    served_models: tuple[str, ...] | None = None
    """What its own ``/v1/models`` listed last (None: not asked yet; the fleet file stands)."""
    model_mismatch: str | None = None
    """``serves X, fleet file says Y`` when what it serves leaves out the declared model."""
    version: str = ""
    """The model version it runs (``Replica.version``: the fleet file's ``version``, or the
    first name its ``/v1/models`` lists)."""
    state_reason: str = ""
    """Why it is in its state (an ejection's reason, ``by alice``); ``""``: none given."""
    warm_up_limit: int | None = None
    """Back in service and warming up: the most requests it may run for now
    (router/slow_start.py); None: only the batch size limits it."""
    kv_booked_tokens: float | None = None
    """The router's booking of its KV cache (router/kv_budget.py): its requests' prompts and
    half their ``max_tokens``, scaled by the engine's own usage; None when the cache's size is
    not known for certain (the engine's figure or the fleet file's)."""
    kv_booking_scale: float = 1.0
    """The engine's reported usage over the booking, as learned (1.0 until it says)."""
    kv_full: bool = False
    """Booked past ``kv_budget.FULL_AT`` of its cache: it takes no more requests for now."""
    gpu_name: str | None = None
    """The name NVML gives its GPUs, from the node agent (None: no agent heard, or its GPUs
    gave different names)."""
    gpu_mismatch: str | None = None
    """``NVML reports X, fleet file says Y`` when the node agent names another card than the
    fleet file declares; the prior is then modelled on the card NVML names."""
    capacity_prior_gpu: str | None = None
    """The GPU profile the prior is modelled on (None: the performance model knows neither
    the card nor the served model, and the static weight stands in)."""


@dataclass(frozen=True, slots=True)
class GpuModelSummary:
    """One GPU model's share of the fleet: is the tier carrying its weight?"""

    gpu_model: str
    replicas: int
    active: int
    utilization: float
    throughput_rps: float
    throughput_share: float
    capacity_share: float
    """Share of the fleet's learned capacity."""
    imbalance_factor: float


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    depth: int
    capacity: int
    by_priority: dict[str, int]


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    time: float
    cluster: str
    strategy: str
    arrivals_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    queue: QueueSnapshot
    replicas: tuple[ReplicaSnapshot, ...]
    by_gpu_model: tuple[GpuModelSummary, ...]
    imbalance_factor: float
    band: Band
    outcomes: dict[str, int]
    in_flight: int
    panic: str | None = None
    """Why every replica in service is routed to, healthy or not (panic mode); None: not."""
    split: dict[str, Any] | None = None
    """The canary's or blue-green set's traffic split (router/rollout/split.py); None: none."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_snapshot(core: RouterCore) -> FleetSnapshot:
    now = core.clock()
    stale_after = 3 * core.fleet.broker.sample_period_s
    loads = replica_loads(core, core.pool.replicas, now)
    replicas = tuple(_replica(core, r, now, stale_after, loads[r.index]) for r in core.pool)
    factor = imbalance_factor(s.load for s in replicas if counted(s.state, s.warm_up_limit))
    throughput = sum(s.throughput_rps for s in replicas)
    return FleetSnapshot(
        time=now,
        cluster=core.fleet.cluster,
        strategy=core.strategy.name,
        arrivals_rps=core.arrivals.rate(now),
        throughput_rps=throughput,
        output_tokens_per_s=sum(s.output_tokens_per_s for s in replicas),
        queue=QueueSnapshot(
            depth=len(core.queue),
            capacity=core.queue.capacity,
            by_priority={p.name.lower(): n for p, n in core.queue.depth_by_priority().items()},
        ),
        replicas=replicas,
        by_gpu_model=_by_gpu_model(replicas, throughput),
        imbalance_factor=factor,
        band=band(factor),
        outcomes={str(k): v for k, v in core.outcomes.items()},
        in_flight=len(core.running),
        panic=core.panic,
        split=None if core.split is None else core.split.to_dict(),
    )


def replica_loads(core: RouterCore, replicas: Sequence[Replica], now: float) -> list[float]:
    """Each replica's load (router/imbalance.py): work sent over the last window plus the
    work it still holds, over what it does in the window at its learned capacity; in order."""
    windows = [core.stats[r.index].cost_sent for r in replicas]
    window_s = windows[0].window_s if windows else 1.0
    return capacity_loads(
        [w.rate(now) * w.window_s for w in windows],
        [r.outstanding_cost for r in replicas],
        [r.speed for r in replicas],
        window_s,
    )


def _replica(
    core: RouterCore, r: Replica, now: float, stale_after: float, load: float
) -> ReplicaSnapshot:
    stats = core.stats[r.index]
    capacity = core.capacity.estimate(r, now)
    util, fresh = r.utilization(now, stale_after)
    age = None if r.telemetry is None else now - r.telemetry.received_at
    ttft, e2e = stats.ttft.values(), stats.e2e.values()
    engine = r.engine
    return ReplicaSnapshot(
        id=r.id,
        node=r.config.node,
        gpu_model=r.config.gpu_model,
        gpus=r.config.gpus,
        tier=r.config.tier,
        state=str(r.state),
        weight=r.weight,
        static_weight=r.config.weight,
        weight_pinned=r.weight_pinned,
        batch_size=r.batch_size,
        batch_pinned=r.batch_pinned,
        in_flight=r.in_flight,
        outstanding_cost=r.outstanding_cost,
        utilization=util,
        utilization_from_telemetry=fresh,
        telemetry_age_s=age,
        stale=age is not None and not fresh,
        completed=r.completed,
        failed=r.failed,
        retries=stats.retries,
        throughput_rps=stats.completions.rate(now),
        output_tokens_per_s=stats.output_tokens.rate(now),
        ttft_p50_s=percentile(ttft, 0.5),
        ttft_p99_s=percentile(ttft, 0.99),
        e2e_p50_s=percentile(e2e, 0.5),
        e2e_p99_s=percentile(e2e, 0.99),
        node_online=r.node_online,
        engine_waiting=None if engine is None else engine.waiting,
        engine_running=None if engine is None else engine.running,
        kv_usage=None if engine is None else engine.kv_usage,
        engine_age_s=None if engine is None else now - engine.received_at,
        load=load,
        capacity_rps=capacity.rps,
        capacity_rate=capacity.rate,
        capacity_source=str(capacity.rate_source),
        capacity_age_s=capacity.rate_age_s,
        capacity_prior_rps=core.capacity.rps(capacity.prior_rate),
        capacity_measured_rps=None
        if capacity.measured_rate is None
        else core.capacity.rps(capacity.measured_rate),
        capacity_measured_concurrency=capacity.measured_concurrency,
        kv_capacity_tokens=capacity.kv_tokens,
        kv_capacity_source=None if capacity.kv_source is None else str(capacity.kv_source),
        kv_capacity_age_s=capacity.kv_age_s,
        engine_preemptions=None if engine is None else engine.preemptions_total,
        model=r.config.model,
        served_models=r.served_models,
        model_mismatch=r.model_mismatch,
        version=r.version,
        state_reason=r.state_reason,
        warm_up_limit=r.warm_up_limit,
        kv_booked_tokens=None if r.kv_limit is None else r.kv.tokens(r.in_flight),
        kv_booking_scale=r.kv.scale,
        kv_full=r.kv.full(r.kv_limit, r.in_flight),
        gpu_name=None if r.telemetry is None else r.telemetry.gpu_name,
        gpu_mismatch=r.gpu_mismatch,
        capacity_prior_gpu=core.capacity.modelled_gpu(r),
    )


def _by_gpu_model(
    replicas: tuple[ReplicaSnapshot, ...], total_throughput: float
) -> tuple[GpuModelSummary, ...]:
    groups: dict[str, list[ReplicaSnapshot]] = defaultdict(list)
    for s in replicas:
        groups[s.gpu_model].append(s)
    total_capacity = sum(s.capacity_rate for s in replicas) or 1.0
    out = []
    for model, members in groups.items():
        active = [s for s in members if s.state == ReplicaState.ACTIVE]
        rps = sum(s.throughput_rps for s in members)
        out.append(
            GpuModelSummary(
                gpu_model=model,
                replicas=len(members),
                active=len(active),
                utilization=sum(s.utilization for s in active) / len(active) if active else 0.0,
                throughput_rps=rps,
                throughput_share=rps / total_throughput if total_throughput > 0 else 0.0,
                capacity_share=sum(s.capacity_rate for s in members) / total_capacity,
                imbalance_factor=imbalance_factor(
                    s.load for s in members if counted(s.state, s.warm_up_limit)
                ),
            )
        )
    return tuple(out)
