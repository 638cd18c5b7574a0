"""A replica's ``/metrics``: Prometheus text with vLLM's metric names and labels.

Names, label and histogram buckets follow vLLM's V1 engine, so dashboards and the router's
scraper read an emulated replica as they read a real one. Times are engine seconds (see
router.emulator.driver). Each replica has its own registry: one process hosts many replicas.

Like vLLM, it publishes its KV cache's size as the labels of ``vllm:cache_config_info`` (a
gauge at 1: ``num_gpu_blocks`` of ``block_size`` 16 tokens, and ``kv_cache_size_tokens``, the
engine's exact capacity) and its cumulative preemptions as ``vllm:num_preemptions_total``,
both with vLLM's ``engine`` label and its labels in vLLM's (sorted) order.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from router.sim.engine import BLOCK_TOKENS, Engine

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "TTFT_BUCKETS",
    "ReplicaMetrics",
    "cache_config_labels",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of the Prometheus text format."""

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's buckets for ``vllm:time_to_first_token_seconds``."""

E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""vLLM's buckets for ``vllm:e2e_request_latency_seconds``."""

_LABELS = ("model_name",)
_ENGINE_INDEX = "0"
"""vLLM's ``engine`` label: the index of the engine in a data-parallel server; one here."""


def cache_config_labels(kv_capacity_tokens: int) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` for a cache of this many tokens: a
    subset of vLLM's ``CacheConfig`` fields, each a string as vLLM writes it, keys sorted."""
    return {
        "block_size": str(BLOCK_TOKENS),
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "engine": _ENGINE_INDEX,
        "kv_cache_size_tokens": str(kv_capacity_tokens),
        "num_gpu_blocks": str(kv_capacity_tokens // BLOCK_TOKENS),
    }


class _Preemptions(Collector):
    """``vllm:num_preemptions_total``, read from the engine when scraped."""

    def __init__(self, model_name: str, engine: Engine) -> None:
        self._model_name = model_name
        self._engine = engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            labels=("engine", "model_name"),
        )
        family.add_metric((_ENGINE_INDEX, self._model_name), self._engine.preemptions)
        yield family


class ReplicaMetrics:
    """The metrics of one replica; gauges read the engine when scraped."""

    def __init__(self, model_name: str, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch.", _LABELS, registry=r
        )
        running.labels(model_name).set_function(lambda: engine.running)
        waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be scheduled.", _LABELS, registry=r
        )
        waiting.labels(model_name).set_function(lambda: len(engine.waiting))
        kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", _LABELS, registry=r
        )
        kv.labels(model_name).set_function(lambda: engine.kv_usage)
        info = cache_config_labels(engine.kv_capacity)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(info),
            registry=r,
        ).labels(**info).set(1)
        r.register(_Preemptions(model_name, engine))
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, seconds.",
            _LABELS,
            registry=r,
            buckets=TTFT_BUCKETS,
        ).labels(model_name)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds.",
            _LABELS,
            registry=r,
            buckets=E2E_BUCKETS,
        ).labels(model_name)
        # prometheus-client appends _total to counter names.
        self._prompt = Counter(
            "vllm:prompt_tokens", "Prefilled prompt tokens.", _LABELS, registry=r
        ).labels(model_name)
        self._generation = Counter(
            "vllm:generation_tokens", "Generated tokens.", _LABELS, registry=r
        ).labels(model_name)

    def on_first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._ttft.observe(ttft_s)
        self._prompt.inc(prompt_tokens)

    def on_finished(self, e2e_s: float, output_tokens: int) -> None:
        self._e2e.observe(e2e_s)
        self._generation.inc(output_tokens)

    def on_aborted(self, generated_tokens: int) -> None:
        self._generation.inc(generated_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
