"""A replica's ``/metrics``: Prometheus text with vLLM's metric families, names and labels.

The families, their types and their label names are vLLM's (0.32), as the contract test
(tests/contract/) records them from a real engine, so dashboards and the router's scraper
read an emulated replica as they read a real one. Every series carries vLLM's ``engine``
(the engine's index in a data-parallel server; one here) and ``model_name`` labels.

Values come from the emulated engine, in engine seconds (router.emulator.driver): gauges are
read when scraped; the engine loop reports each step (inter-token latency, tokens per step),
each first token and each end; the HTTP handler reports each finished request with its finish
reason and its phases (queued, prefill, decode). The emulator has no prefix cache, so prefix
cache counters stay at 0 and ``cache_config_info`` says ``enable_prefix_caching="False"``.

Like vLLM, it publishes its KV cache's size as the labels of ``vllm:cache_config_info`` (a
gauge at 1: ``num_gpu_blocks`` of ``block_size`` 16 tokens, and ``kv_cache_size_tokens``, the
engine's exact capacity). Each replica has its own registry: one process hosts many replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from router.emulator.histogram import WeightedHistogram, one_two_five
from router.sim.engine import BLOCK_TOKENS, Engine

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "FINISH_REASONS",
    "TTFT_BUCKETS",
    "FinishedRequest",
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
"""vLLM's buckets for end-to-end latency and each phase of a request."""

TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's buckets for inter-token latency and time per output token."""

ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""vLLM's buckets for tokens per engine step."""

N_BUCKETS = (1, 2, 5, 10, 20)
"""vLLM's buckets for the ``n`` request parameter."""

FINISH_REASONS = ("stop", "length", "abort")
"""vLLM's ``finished_reason`` label values; each is published from the start, at 0."""

_ENGINE_INDEX = "0"
_LABELS = ("engine", "model_name")
_PER_REQUEST = (
    ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
)


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


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """One request the engine finished, in engine seconds, as its handler saw it."""

    arrived_at: float
    scheduled_at: float
    """When its prefill began (the end of its wait in the queue)."""
    first_token_at: float
    finished_at: float
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    max_tokens: int | None
    """The request's ``max_tokens`` (None: it set none)."""


class ReplicaMetrics(Collector):
    """The metrics of one replica; gauges read the engine when scraped."""

    def __init__(self, model_name: str, engine: Engine, max_model_len: int) -> None:
        self._model_name = model_name
        self._engine = engine
        self._counters = dict.fromkeys(("prompt_tokens", "generation_tokens"), 0)
        self._successes = dict.fromkeys(FINISH_REASONS, 0)
        lengths = one_two_five(max_model_len)
        buckets: dict[str, tuple[float, ...]] = {
            "time_to_first_token_seconds": TTFT_BUCKETS,
            "inter_token_latency_seconds": TOKEN_LATENCY_BUCKETS,
            "request_time_per_output_token_seconds": TOKEN_LATENCY_BUCKETS,
            **{name: E2E_BUCKETS for name, _ in _PER_REQUEST},
            "iteration_tokens_total": ITERATION_BUCKETS,
            "request_prompt_tokens": lengths,
            "request_generation_tokens": lengths,
            "request_max_num_generation_tokens": lengths,
            "request_params_max_tokens": lengths,
            "request_params_n": N_BUCKETS,
        }
        self._histograms = {name: WeightedHistogram(b) for name, b in buckets.items()}
        self.registry = CollectorRegistry()
        self.registry.register(self)

    # --- what the engine loop reports -------------------------------------------------------

    def on_step(self, duration_s: float, decode_tokens: int, prefill_tokens: int) -> None:
        """A step began: each decoding sequence's next token comes ``duration_s`` after its
        last one."""
        self._histograms["iteration_tokens_total"].observe(decode_tokens + prefill_tokens)
        if decode_tokens:
            self._histograms["inter_token_latency_seconds"].observe(duration_s, decode_tokens)

    def on_first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._histograms["time_to_first_token_seconds"].observe(ttft_s)
        self._counters["prompt_tokens"] += prompt_tokens

    def on_finished(self, e2e_s: float, output_tokens: int) -> None:
        self._histograms["e2e_request_latency_seconds"].observe(e2e_s)
        self._counters["generation_tokens"] += output_tokens

    def on_aborted(self, generated_tokens: int) -> None:
        self._counters["generation_tokens"] += generated_tokens
        self._successes["abort"] += 1

    # --- what the HTTP handler reports ------------------------------------------------------

    def on_request_end(self, done: FinishedRequest) -> None:
        """A finished request's reason, phases and lengths."""
        self._successes[done.finish_reason] = self._successes.get(done.finish_reason, 0) + 1
        decode = done.finished_at - done.first_token_at
        phases = {
            "request_queue_time_seconds": done.scheduled_at - done.arrived_at,
            "request_inference_time_seconds": done.finished_at - done.scheduled_at,
            "request_prefill_time_seconds": done.first_token_at - done.scheduled_at,
            "request_decode_time_seconds": decode,
            "request_prompt_tokens": done.prompt_tokens,
            "request_generation_tokens": done.output_tokens,
            "request_max_num_generation_tokens": done.max_tokens or done.output_tokens,
            "request_params_n": 1,
        }
        if done.output_tokens > 1:
            tpot = decode / (done.output_tokens - 1)
            phases["request_time_per_output_token_seconds"] = tpot
        if done.max_tokens is not None:
            phases["request_params_max_tokens"] = done.max_tokens
        for name, value in phases.items():
            self._histograms[name].observe(value)

    # --- the page ---------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        yield from self._gauges()
        yield from self._counter_families()
        for name, histogram in self._histograms.items():
            family = HistogramMetricFamily(f"vllm:{name}", _HELP.get(name, name), labels=_LABELS)
            histogram.add_to(family, self._labels())
            yield family

    def _labels(self, *extra: str) -> list[str]:
        return [_ENGINE_INDEX, self._model_name, *extra]

    def _gauges(self) -> Iterator[GaugeMetricFamily]:
        engine = self._engine
        values = {
            "num_requests_running": engine.running,
            "num_requests_waiting": len(engine.waiting),
            "kv_cache_usage_perc": engine.kv_usage,
        }
        for name, value in values.items():
            family = GaugeMetricFamily(f"vllm:{name}", _HELP[name], labels=_LABELS)
            family.add_metric(self._labels(), value)
            yield family
        # Every request the emulated engine holds back waits for KV cache or a batch slot;
        # none waits on something else (vLLM's "deferred": grammars, remote KV).
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            _HELP["num_requests_waiting_by_reason"],
            labels=(*_LABELS, "reason"),
        )
        by_reason.add_metric(self._labels("capacity"), len(engine.waiting))
        by_reason.add_metric(self._labels("deferred"), 0)
        yield by_reason
        info = cache_config_labels(engine.kv_capacity)
        cache = GaugeMetricFamily(
            "vllm:cache_config_info", _HELP["cache_config_info"], labels=tuple(info)
        )
        cache.add_metric(list(info.values()), 1)
        yield cache

    def _counter_families(self) -> Iterator[CounterMetricFamily]:
        values = {
            **self._counters,
            "num_preemptions": self._engine.preemptions,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
        }
        for name, value in values.items():
            family = CounterMetricFamily(f"vllm:{name}", _HELP[name], labels=_LABELS)
            family.add_metric(self._labels(), value)
            yield family
        success = CounterMetricFamily(
            "vllm:request_success", _HELP["request_success"], labels=(*_LABELS, "finished_reason")
        )
        for reason, count in self._successes.items():
            success.add_metric(self._labels(reason), count)
        yield success


_HELP = {
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": "Number of requests waiting, by the reason they wait.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
    "prompt_tokens": "Number of prefill tokens processed.",
    "generation_tokens": "Number of generation tokens processed.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "request_success": "Count of successfully processed requests.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per "
    "request.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation "
    "tokens.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "request_params_n": "Histogram of the n request parameter.",
    **dict(_PER_REQUEST),
}
