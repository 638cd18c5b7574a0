"""A replica's ``/metrics``: Prometheus text with vLLM's metric families, names and labels.

The families, their types, their label names and their samples (``_total``, ``_bucket``,
``_created``) are vLLM 0.32's, as the contract test (tests/contract/) recorded them from a real
engine, so dashboards and the router's scraper read an emulated replica as they read a real
one. Every series carries vLLM's ``engine`` (the engine's index in a data-parallel server;
one here) and ``model_name`` labels, but for ``vllm:admission_rejections``, which vLLM labels
by model only.

Values come from the emulated engine, in engine seconds (router.emulator.driver): gauges are
read when scraped; the engine loop reports each step (inter-token latency, tokens per step),
each first token and each end; the HTTP handler reports each finished request with its finish
reason and its phases (queued, prefill, decode). What the emulator has no part of stays at 0,
as on a real engine without it: the prefix cache (``cache_config_info`` says
``enable_prefix_caching="False"``), external KV transfer, the multi-modal cache, the model
FLOPs estimates (off unless vLLM is asked for them), admission limits (none by default).
Each replica has its own page (router/emulator/exposition.py): one process hosts many replicas.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from router.emulator.cache_config import ENGINE_INDEX, cache_config_labels
from router.emulator.exposition import Page, label_text
from router.emulator.histogram import WeightedHistogram, one_two_five
from router.perf.model import Deployment
from router.sim.engine import Engine

__all__ = [
    "CONTENT_TYPE",
    "E2E_BUCKETS",
    "FINISH_REASONS",
    "TTFT_BUCKETS",
    "FinishedRequest",
    "ReplicaMetrics",
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

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's ``finished_reason`` label values; each is published from the start, at 0."""

_LABELLED_COUNTERS = {
    # family: (its extra label, the values vLLM publishes from the start)
    "prompt_tokens_by_source": (
        "source",
        ("local_compute", "local_cache_hit", "external_kv_transfer"),
    ),
    "prompt_tokens_cached_by_source": (
        "source",
        ("device", "host", "p2p", "disk", "external_unspecified"),
    ),
}
_ZERO_COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "mm_cache_queries",
    "mm_cache_hits",
    "prompt_tokens_cached",
    "estimated_flops_per_gpu",
    "estimated_read_bytes_per_gpu",
    "estimated_write_bytes_per_gpu",
)
_SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
_ADMISSION_LIMITS = ("max_num_queued_reqs", "max_num_queued_tokens")


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
    preemptions: int = 0


class ReplicaMetrics:
    """The metrics of one replica; gauges read the engine when scraped."""

    def __init__(
        self, model_name: str, engine: Engine, max_model_len: int, deployment: Deployment
    ) -> None:
        self._model_name = model_name
        self._engine = engine
        self._base = label_text({"engine": ENGINE_INDEX, "model_name": model_name})
        self._cache = label_text(cache_config_labels(engine.kv_capacity, deployment, max_model_len))
        self._created = time.time()
        self._counters = dict.fromkeys(("prompt_tokens", "generation_tokens"), 0)
        self._successes = dict.fromkeys(FINISH_REASONS, 0)
        lengths = one_two_five(max_model_len)
        buckets: dict[str, tuple[float, ...]] = {
            "time_to_first_token_seconds": TTFT_BUCKETS,
            "inter_token_latency_seconds": TOKEN_LATENCY_BUCKETS,
            "request_time_per_output_token_seconds": TOKEN_LATENCY_BUCKETS,
            **dict.fromkeys(_PHASES, E2E_BUCKETS),
            "e2e_request_latency_seconds": E2E_BUCKETS,
            "iteration_tokens_total": ITERATION_BUCKETS,
            "request_prompt_tokens": lengths,
            "request_generation_tokens": lengths,
            "request_prefill_kv_computed_tokens": lengths,
            "request_max_num_generation_tokens": lengths,
            "request_params_max_tokens": lengths,
            "request_params_n": (1, 2, 5, 10, 20),
            "request_num_preemptions": (1, 2, 3, 4, 5, 10, 20),
        }
        self._histograms = {name: WeightedHistogram(b) for name, b in buckets.items()}

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
        observed = {
            "request_queue_time_seconds": done.scheduled_at - done.arrived_at,
            "request_inference_time_seconds": done.finished_at - done.scheduled_at,
            "request_prefill_time_seconds": done.first_token_at - done.scheduled_at,
            "request_decode_time_seconds": decode,
            "request_prompt_tokens": done.prompt_tokens,
            # No prefix cache: every prompt token is computed.
            "request_prefill_kv_computed_tokens": done.prompt_tokens,
            "request_generation_tokens": done.output_tokens,
            "request_max_num_generation_tokens": done.max_tokens or done.output_tokens,
            "request_params_n": 1,
            "request_num_preemptions": done.preemptions,
        }
        if done.output_tokens > 1:
            tpot = decode / (done.output_tokens - 1)
            observed["request_time_per_output_token_seconds"] = tpot
        if done.max_tokens is not None:
            observed["request_params_max_tokens"] = done.max_tokens
        for name, value in observed.items():
            self._histograms[name].observe(value)

    # --- the page ---------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        page = Page()
        self._gauges(page)
        self._counter_families(page)
        for name, histogram in self._histograms.items():
            total, created = histogram.total, self._created
            buckets = histogram.cumulative()
            page.histogram(f"vllm:{name}", _HELP[name], self._base, buckets, total, created)
        return page.render()

    def _with(self, label: str, value: str) -> str:
        """The replica's labels and one more, sorted by name as vLLM writes them."""
        labels = {"engine": ENGINE_INDEX, "model_name": self._model_name, label: value}
        return label_text(dict(sorted(labels.items())))

    def _gauges(self, page: Page) -> None:
        engine = self._engine
        waiting = len(engine.waiting)
        values = {
            "num_requests_running": engine.running,
            "num_requests_waiting": waiting,
            "kv_cache_usage_perc": engine.kv_usage,
        }
        for name, value in values.items():
            page.gauge(f"vllm:{name}", _HELP[name], [(self._base, value)])
        # Every request the emulated engine holds back waits for KV cache or a batch slot;
        # none waits on something else (vLLM's "deferred": LoRA budget, KV transfer).
        by_reason = [
            (self._with("reason", "capacity"), waiting),
            (self._with("reason", "deferred"), 0),
        ]
        name = "num_requests_waiting_by_reason"
        page.gauge(f"vllm:{name}", _HELP[name], by_reason)
        sleep = [(self._with("sleep_state", s), int(s == "awake")) for s in _SLEEP_STATES]
        page.gauge("vllm:engine_sleep_state", _HELP["engine_sleep_state"], sleep)
        page.gauge("vllm:cache_config_info", _HELP["cache_config_info"], [(self._cache, 1)])

    def _counter_families(self, page: Page) -> None:
        plain = {
            **self._counters,
            "num_preemptions": self._engine.preemptions,
            **dict.fromkeys(_ZERO_COUNTERS, 0),
        }
        for name, value in plain.items():
            page.counter(f"vllm:{name}", _HELP[name], [(self._base, value)], self._created)
        successes = [(self._with("finished_reason", r), n) for r, n in self._successes.items()]
        name = "request_success"
        page.counter(f"vllm:{name}", _HELP[name], successes, self._created)
        for name, (label, keys) in _LABELLED_COUNTERS.items():
            local = self._counters["prompt_tokens"] if name == "prompt_tokens_by_source" else 0
            counts = [(self._with(label, k), local if k == "local_compute" else 0) for k in keys]
            page.counter(f"vllm:{name}", _HELP[name], counts, self._created)
        model = label_text({"model_name": self._model_name})
        rejections = [(f'{model},reason="{reason}"', 0) for reason in _ADMISSION_LIMITS]
        name = "admission_rejections"
        page.counter(f"vllm:{name}", _HELP[name], rejections, self._created)


_PHASES = {
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
}

_HELP = {
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: "
    "'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient "
    "constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
    "vllm:num_requests_waiting.",
    "engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 "
    "means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
    "sleep level 2.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
    "prompt_tokens": "Number of prefill tokens processed.",
    "generation_tokens": "Number of generation tokens processed.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "external_prefix_cache_queries": "External prefix cache queries from KV connector "
    "cross-instance cache sharing, in terms of number of queried tokens.",
    "external_prefix_cache_hits": "External prefix cache hits from KV connector cross-instance "
    "cache sharing, in terms of number of cached tokens.",
    "mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "prompt_tokens_by_source": "Number of prompt tokens by source.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied "
    "them.",
    "estimated_flops_per_gpu": "Estimated number of floating point operations per GPU (for "
    "Model Flops Utilization calculations).",
    "estimated_read_bytes_per_gpu": "Estimated number of bytes read from memory per GPU (for "
    "Model Flops Utilization calculations).",
    "estimated_write_bytes_per_gpu": "Estimated number of bytes written to memory per GPU (for "
    "Model Flops Utilization calculations).",
    "request_success": "Count of successfully processed requests.",
    "admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per "
    "request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill "
    "(excluding cached tokens).",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation "
    "tokens.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    **_PHASES,
}
