"""One /metrics for a ``gpurouter serve --workers N``: every worker's own series, each with a
``worker`` label, and the supervisor's bookkeeping from the load table.

Whichever worker the kernel hands a scrape to answers it: its own text, and each sibling's
(``GET /worker/metrics`` on its private socket). Nothing is summed here, because not every
series may be: counters and histograms (requests, responses, latencies) are each worker's
own, to be summed (``sum without (worker)``); a replica's ``in_flight`` gauge is already the
whole service's in every worker (the load table), to be read from any one (``max without
(worker)``); queue depth is each worker's own queue. A worker that does not answer in time
is left out and shows as ``gpurouter_worker_up{worker} 0``. Added series:

| metric | type | labels |
|---|---|---|
| ``gpurouter_workers`` | gauge | |
| ``gpurouter_worker_up`` | gauge (1 when it answered this scrape) | ``worker`` |
| ``gpurouter_worker_restarts_total`` | counter (the supervisor restarted it) | ``worker`` |
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from router.workers.load_table import LoadTable
from router.workers.private_api import OWN_METRICS
from router.workers.worker_client import UNREACHABLE, WorkerClient

__all__ = ["ServiceMetrics", "merge"]


class ServiceMetrics:
    def __init__(
        self,
        index: int,
        own: Callable[[], bytes],
        client: WorkerClient,
        table: LoadTable,
    ) -> None:
        self.index = index
        self.own = own
        self.client = client
        self.table = table

    async def render(self) -> bytes:
        """The service's Prometheus text (the front door's ``/metrics``)."""
        indexes = range(self.table.workers)
        texts = await asyncio.gather(*(self._text(i) for i in indexes))
        restarts = [self.table.restarts(i) for i in indexes]
        return merge(dict(zip(indexes, texts, strict=True)), restarts)

    async def _text(self, index: int) -> str | None:
        if index == self.index:
            return self.own().decode()
        try:
            answer = await self.client.request(index, "GET", OWN_METRICS)
        except UNREACHABLE:
            return None
        return answer.body.decode() if answer.status == 200 else None


def merge(texts: dict[int, str | None], restarts: list[int]) -> bytes:
    """Every worker's families with a ``worker`` label; None: that worker did not answer."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(texts, restarts))
    return generate_latest(registry)


class _Merged(Collector):
    def __init__(self, texts: dict[int, str | None], restarts: list[int]) -> None:
        self.texts = texts
        self.restarts = restarts

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for index, text in sorted(self.texts.items()):
            if text is None:
                continue
            label = str(index)
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = Metric(family.name, family.documentation, family.type, family.unit)
                    families[family.name] = merged
                merged.samples.extend(
                    Sample(s.name, {**s.labels, "worker": label}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        yield from families.values()
        yield GaugeMetricFamily("gpurouter_workers", "Worker processes", value=len(self.texts))
        up = GaugeMetricFamily(
            "gpurouter_worker_up", "1 when the worker answered this scrape", labels=["worker"]
        )
        restarts = CounterMetricFamily(
            "gpurouter_worker_restarts",
            "Times the supervisor restarted the worker",
            labels=["worker"],
        )
        for index, text in sorted(self.texts.items()):
            up.add_metric([str(index)], 0 if text is None else 1)
            restarts.add_metric([str(index)], self.restarts[index])
        yield up
        yield restarts
