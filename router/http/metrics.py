"""Prometheus metrics of one router, in a registry of its own.

Almost everything is read from the core when Prometheus scrapes (a custom collector), so the
hot path pays only for the two latency histograms. Names:

| metric | type | labels |
|---|---|---|
| ``gpurouter_requests_total`` | counter | ``outcome`` (completed, failed, rejected, expired) |
| ``gpurouter_replica_requests_total`` | counter | ``replica``, ``outcome`` (completed, failed) |
| ``gpurouter_retries_total`` | counter | ``replica`` (the replica an attempt failed on) |
| ``gpurouter_ejections_total`` | counter | ``replica``, ``cause`` (failures, health_check) |
| ``gpurouter_panic`` | gauge (1 in panic mode) | |
| ``gpurouter_replica_in_flight`` | gauge | ``replica`` |
| ``gpurouter_replica_batch_size`` | gauge | ``replica`` |
| ``gpurouter_replica_weight`` | gauge | ``replica`` |
| ``gpurouter_replica_state`` | gauge (1 for the current state) | ``replica``, ``state`` |
| ``gpurouter_replica_model_mismatch`` | gauge | ``replica``, ``declared``, ``served`` |
| ``gpurouter_replica_gpu_mismatch`` | gauge | ``replica``, ``declared``, ``reported`` |
| ``gpurouter_in_flight`` | gauge | |
| ``gpurouter_queue_depth`` | gauge | |
| ``gpurouter_queue_depth_by_priority`` | gauge | ``priority`` |
| ``gpurouter_queue_capacity`` | gauge | |
| ``gpurouter_imbalance_factor`` | gauge | |
| ``gpurouter_strategy_info`` | info | ``strategy`` |
| ``gpurouter_ttft_seconds`` | histogram | ``replica`` |
| ``gpurouter_e2e_latency_seconds`` | histogram | ``replica`` |
| ``gpurouter_http_responses_total`` | counter | ``route``, ``status``, ``reason`` (responses.py) |

and, for a router with an MQTT feed, its drops (feed_metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router.core import Assignment, CoreListener, Finished, Outcome, RouterCore
from router.http.feed_metrics import FeedCollector
from router.http.responses import ResponseCounter
from router.imbalance import counted, imbalance_factor
from router.kv_budget import FULL_AT
from router.replica import ReplicaState
from router.snapshot import replica_loads
from router.telemetry.status import TelemetryStatus

__all__ = ["CONTENT_TYPE", "RouterMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
"""vLLM's TTFT buckets, so router and engine histograms line up."""
E2E_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
)  # fmt: skip


class RouterMetrics(CoreListener):
    """The registry of one router; ``render()`` is the /metrics body."""

    def __init__(
        self,
        core: RouterCore,
        ejections: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        engine_rejected: Callable[[], Mapping[str, int]] | None = None,
        telemetry: Callable[[], TelemetryStatus] | None = None,
    ) -> None:
        """``engine_rejected``: per replica, the engine /metrics values refused as nonsense
        (router/telemetry/engine_metrics.py); ``telemetry``: the MQTT feeds' status, whose
        drops go on /metrics (settable later: the admin API hands over its own)."""
        self.core = core
        self.registry = CollectorRegistry(auto_describe=False)
        self._ejections_source = ejections
        self._engine_rejected = engine_rejected
        self.telemetry = telemetry
        self.responses = ResponseCounter(self.registry)
        """Every answer of the front door and the admin API (responses.py)."""
        ids = [r.id for r in core.pool]
        ttft = Histogram(
            "gpurouter_ttft_seconds",
            "Time from arrival at the router to the first byte sent to the client.",
            ["replica"],
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        e2e = Histogram(
            "gpurouter_e2e_latency_seconds",
            "Time from arrival at the router to the end of a completed request.",
            ["replica"],
            registry=self.registry,
            buckets=E2E_BUCKETS,
        )
        # Children bound once: observe() on the hot path is then one call.
        self._ttft = [ttft.labels(i) for i in ids]
        self._e2e = {i: e2e.labels(i) for i in ids}
        self.registry.register(_CoreCollector(self))
        self.registry.register(FeedCollector(self._feed))
        core.listeners.append(self)

    @staticmethod
    def of(core: RouterCore) -> RouterMetrics | None:
        """The metrics registered on ``core`` (each registers itself as a listener), if any."""
        return next((m for m in core.listeners if isinstance(m, RouterMetrics)), None)

    def _feed(self) -> TelemetryStatus | None:
        return None if self.telemetry is None else self.telemetry()

    def first_byte(self, a: Assignment) -> None:
        if a.first_byte is not None and a.first_token:  # a stream's: see RouterCore.first_byte
            self._ttft[a.replica.index].observe(a.first_byte - a.request.arrival)

    def on_finish(self, finished: Finished) -> None:
        if finished.outcome is Outcome.COMPLETED and finished.replica is not None:
            self._e2e[finished.replica].observe(finished.time - finished.request.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CoreCollector(Collector):
    """Reads the core's counters and gauges at scrape time."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        core = self._metrics.core
        yield _requests(core)
        yield from _replicas(core)
        ejections = CounterMetricFamily(
            "gpurouter_ejections",
            "Replicas ejected by health checking, by cause.",
            labels=["replica", "cause"],
        )
        source = self._metrics._ejections_source
        for (replica, cause), count in (source() if source else {}).items():
            ejections.add_metric([replica, cause], count)
        yield ejections
        rejected = CounterMetricFamily(
            "gpurouter_engine_metrics_rejected_values",
            "Engine /metrics values refused as nonsense (negative, NaN, out of range); the "
            "last good value was kept.",
            labels=["replica"],
        )
        engine_source = self._metrics._engine_rejected
        for replica, count in (engine_source() if engine_source else {}).items():
            rejected.add_metric([replica], count)
        yield rejected
        yield from _queue(core)
        yield GaugeMetricFamily(
            "gpurouter_panic",
            "1 while too few replicas are healthy and every replica in service is routed to "
            "(panic mode), else 0.",
            float(core.panic is not None),
        )
        yield GaugeMetricFamily(
            "gpurouter_in_flight", "Requests running on replicas.", len(core.running)
        )
        balanced = [r for r in core.pool if counted(r.state, r.warm_up_limit)]
        yield GaugeMetricFamily(
            "gpurouter_imbalance_factor",
            "Max over min load (work sent over learned capacity) of the active replicas, "
            "those warming up after their return left out (1.0 idle).",
            imbalance_factor(replica_loads(core, balanced, core.clock())),
        )
        info = InfoMetricFamily("gpurouter_strategy", "The routing strategy in use.")
        info.add_metric([], {"strategy": core.strategy.name})
        yield info


def _requests(core: RouterCore) -> Metric:
    family = CounterMetricFamily(
        "gpurouter_requests", "Requests ended, by outcome.", labels=["outcome"]
    )
    for outcome in Outcome:
        family.add_metric([str(outcome)], core.outcomes.get(outcome, 0))
    return family


def _replicas(core: RouterCore) -> Iterable[Metric]:
    requests = CounterMetricFamily(
        "gpurouter_replica_requests",
        "Attempts ended on each replica, by outcome.",
        labels=["replica", "outcome"],
    )
    retries = CounterMetricFamily(
        "gpurouter_retries", "Attempts retried elsewhere after failing here.", labels=["replica"]
    )
    in_flight = GaugeMetricFamily(
        "gpurouter_replica_in_flight", "Requests running on the replica.", labels=["replica"]
    )
    batch = GaugeMetricFamily(
        "gpurouter_replica_batch_size",
        "Most requests sent to the replica at once.",
        labels=["replica"],
    )
    weight = GaugeMetricFamily(
        "gpurouter_replica_weight", "The replica's effective weight.", labels=["replica"]
    )
    state = GaugeMetricFamily(
        "gpurouter_replica_state", "1 for the replica's current state.", labels=["replica", "state"]
    )
    yield from _capacity(core)
    yield _model_mismatch(core)
    yield _gpu_mismatch(core)
    for r in core.pool:
        requests.add_metric([r.id, "completed"], r.completed)
        requests.add_metric([r.id, "failed"], r.failed)
        retries.add_metric([r.id], core.stats[r.index].retries)
        in_flight.add_metric([r.id], r.in_flight)
        batch.add_metric([r.id], r.batch_size)
        weight.add_metric([r.id], r.weight)
        for s in ReplicaState:
            state.add_metric([r.id, str(s)], 1.0 if r.state is s else 0.0)
    yield from (requests, retries, in_flight, batch, weight, state)


def _model_mismatch(core: RouterCore) -> Metric:
    """Per replica that said what it serves (router/http/served_models.py): 1 when that leaves
    out the model the fleet file declares for it, 0 when it serves it; ``served`` lists its
    answer, comma-separated."""
    family = GaugeMetricFamily(
        "gpurouter_replica_model_mismatch",
        "1 when the replica's /v1/models leaves out the model the fleet file declares for it "
        "(it gets none of that model's requests); absent until the replica answered.",
        labels=["replica", "declared", "served"],
    )
    for r in core.pool:
        if r.served_models is not None:
            labels = [r.id, r.config.model, ",".join(r.served_models)]
            family.add_metric(labels, 0.0 if r.model_mismatch is None else 1.0)
    return family


def _gpu_mismatch(core: RouterCore) -> Metric:
    """Per replica whose node agent named its GPUs: 1 when NVML names another card than the
    fleet file declares (its prior is then modelled on the card NVML names), else 0."""
    family = GaugeMetricFamily(
        "gpurouter_replica_gpu_mismatch",
        "1 when the node agent's NVML name for the replica's GPUs is another card than the "
        "fleet file declares (its capacity prior is then modelled on that card); absent until "
        "the agent named them.",
        labels=["replica", "declared", "reported"],
    )
    for r in core.pool:
        name = None if r.telemetry is None else r.telemetry.gpu_name
        if name is not None:
            labels = [r.id, r.config.gpu_model, name]
            family.add_metric(labels, 0.0 if r.gpu_mismatch is None else 1.0)
    return family


def _capacity(core: RouterCore) -> Iterable[Metric]:
    """Learned capacity per replica, with where each figure came from (router/capacity.py)."""
    rps = GaugeMetricFamily(
        "gpurouter_replica_capacity_rps",
        "Learned capacity: requests per second at saturation, at the fleet's mean request.",
        labels=["replica", "source"],
    )
    age = GaugeMetricFamily(
        "gpurouter_replica_capacity_age_seconds",
        "Seconds since a completion last refined the learned capacity (absent: never).",
        labels=["replica"],
    )
    at_once = GaugeMetricFamily(
        "gpurouter_replica_capacity_measured_concurrency",
        "Requests at once the measured capacity speaks for, where short of the batch size "
        "(a card the performance model does not know, run a few at a time); absent: at the "
        "batch size, or nothing measured.",
        labels=["replica"],
    )
    kv = GaugeMetricFamily(
        "gpurouter_replica_kv_capacity_tokens",
        "Learned KV-cache size in tokens, by source (engine, fleet file, prior).",
        labels=["replica", "source"],
    )
    booked = GaugeMetricFamily(
        "gpurouter_replica_kv_booked_tokens",
        "The router's booking of the KV cache (prompts and half of max_tokens, scaled by the "
        f"engine's usage); a replica booked to {FULL_AT:.0%} of its cache takes no more requests.",
        labels=["replica"],
    )
    now = core.clock()
    for r in core.pool:
        e = core.capacity.estimate(r, now)
        rps.add_metric([r.id, str(e.rate_source)], e.rps)
        if e.rate_age_s is not None:
            age.add_metric([r.id], e.rate_age_s)
        if e.measured_concurrency is not None:
            at_once.add_metric([r.id], e.measured_concurrency)
        if e.kv_tokens is not None and e.kv_source is not None:
            kv.add_metric([r.id, str(e.kv_source)], e.kv_tokens)
        if r.kv_limit is not None:
            booked.add_metric([r.id], r.kv.tokens(r.in_flight))
    return rps, age, at_once, kv, booked


def _queue(core: RouterCore) -> Iterable[Metric]:
    yield GaugeMetricFamily(
        "gpurouter_queue_depth", "Requests waiting to be placed.", len(core.queue)
    )
    yield GaugeMetricFamily(
        "gpurouter_queue_capacity", "Most requests that may wait.", core.queue.capacity
    )
    by_priority = GaugeMetricFamily(
        "gpurouter_queue_depth_by_priority", "Requests waiting, by priority.", labels=["priority"]
    )
    for priority, n in core.queue.depth_by_priority().items():
        by_priority.add_metric([priority.name.lower()], n)
    yield by_priority
