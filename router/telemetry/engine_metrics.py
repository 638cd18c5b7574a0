"""Engine load from each replica's own ``/metrics``: one signal per replica, whatever engine.

Engines name the same things differently, and names change between versions (old cards often
pin old vLLM), so the poller normalises them:

- vLLM (V1, 0.10 and later): ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc``; KV size from the labels of ``vllm:cache_config_info`` (an info
  gauge, value 1): ``kv_cache_size_tokens`` where the engine sets it (it is right for hybrid
  models, where blocks times block size is not), else ``num_gpu_blocks`` times ``block_size``;
  preemptions ``vllm:num_preemptions_total``;
- older vLLM: the same queue names, KV usage as ``vllm:gpu_cache_usage_perc``, preemptions
  also as ``vllm:num_preemptions``;
- SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``;
  KV size ``sglang:max_total_num_tokens``; preemptions (SGLang says retractions)
  ``sglang:num_retracted_requests_total`` (``sglang:num_retracted_reqs`` is the last batch's
  count, a gauge, not a counter, and is not read);
- TGI: ``tgi_queue_size``, ``tgi_batch_current_size``; KV size ``tgi_batch_max_total_tokens``
  where the page has it; no KV-cache usage and no preemptions (TGI reserves a request's whole
  token budget when it admits it, and never preempts).

A server with data parallelism reports one sample per engine (vLLM's label ``engine``,
SGLang's ``dp_rank``): queues, KV sizes and preemptions are their sums, KV usage their mean.
Where both KV usage names appear, the current one wins.

A value outside its bounds (the constants below), or not a number at all, is nonsense from a
broken exporter, not a reading: the page's :class:`EngineReading` names it in ``rejected``
and leaves that field empty, and the poller keeps the field's last good value and counts it.
A preemption counter lower than the last one is an engine that restarted: a new baseline,
not nonsense.

:class:`EngineMetricsPoller` reads every replica each ``engine_metrics_interval_s`` (fleet
file, ``router.health``) with aiohttp and sets ``Replica.engine``
(:class:`~router.replica.EngineLoad`), stamped with the router's clock: the capacity-aware
strategy takes its KV usage from there while it is fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from router.clock import Clock
from router.core import RouterCore
from router.errors import TelemetryError
from router.replica import EngineLoad, Replica
from router.telemetry.status import EngineMetricsStatus

MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A /metrics page larger than this is refused unread (vLLM's is tens of KiB)."""

# Bounds: a value outside them is a broken exporter, never a reading.

MAX_KV_USAGE = 1.0
"""KV-cache usage is a fraction of the cache (vLLM: "1 means 100 percent"); 0..1 holds every
reading a working engine can make, so 7.0 or -1 is nonsense, not a full or empty cache."""

MAX_ENGINE_REQUESTS = 1_000_000
"""Most requests one replica's engine plausibly holds, waiting or running. The running batch
stops at the engine's sequence limit (vLLM's ``max_num_seqs``: 256 by default, a few thousand
at most); the waiting queue has no limit, but a million queued requests is beyond any
deployment, and the bound turns away an exporter's 1e30."""

MIN_KV_CAPACITY_TOKENS = 16
"""One KV block (vLLM's default block size): a cache smaller than that cannot hold any request,
so 0 (or less) is an engine that has not sized its cache, or a broken one."""

MAX_KV_CAPACITY_TOKENS = 10_000_000_000
"""Ten billion tokens. A toy model at 2 KiB per token on eight 192 GB GPUs caches under a
billion; real models take tens to hundreds of KiB per token. Ten times that margin still
turns away an exporter's 1e15."""

MAX_PREEMPTIONS = 2**53
"""A float64 counter stops counting by one past 2**53, so a larger count is not a count."""

_NAMES: dict[str, tuple[str, str, str | None]] = {
    # engine: (waiting, running, kv usage)
    "vllm": ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
    "vllm-deprecated": (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:gpu_cache_usage_perc",
    ),
    "sglang": ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"),
    "tgi": ("tgi_queue_size", "tgi_batch_current_size", None),
}
_VLLM_CACHE_INFO = "vllm:cache_config_info"
_KV_CAPACITY: dict[str, str | None] = {
    # engine: the gauge that says how many tokens the KV cache holds (vLLM: in labels)
    "vllm": _VLLM_CACHE_INFO,
    "vllm-deprecated": _VLLM_CACHE_INFO,
    "sglang": "sglang:max_total_num_tokens",
    "tgi": "tgi_batch_max_total_tokens",
}
_PREEMPTIONS: dict[str, tuple[str, ...]] = {
    # engine: the cumulative preemption counter's sample names, preferred first
    "vllm": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "vllm-deprecated": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "sglang": ("sglang:num_retracted_requests_total",),
    "tgi": (),
}
_WANTED = frozenset(
    [n for names in _NAMES.values() for n in names if n is not None]
    + [n for n in _KV_CAPACITY.values() if n is not None]
    + [n for names in _PREEMPTIONS.values() for n in names]
)
_WANTED_PREFIXES = tuple(sorted(_WANTED))
_ENGINE_LABELS = ("engine", "dp_rank")
"""Labels that tell a data-parallel server's engines apart (vLLM, SGLang)."""
_NOT_SAID = frozenset({"", "none", "null"})
"""How a cache-config label reads before the engine has a figure (vLLM writes ``str(None)``)."""

_Samples: TypeAlias = list[tuple[Mapping[str, str], float]]
_T = TypeVar("_T")


class EngineMetricsError(TelemetryError):
    """A replica's /metrics could not be read or carried none of the known names."""

    title = "engine metrics unreadable"


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One replica's engine load, normalised. A field is None when the page does not say, or
    when what it says is nonsense; ``rejected`` tells the two apart."""

    engine: str
    waiting: int | None
    running: int | None
    kv_usage: float | None
    kv_capacity_tokens: int | None = None
    preemptions_total: int | None = None
    rejected: Mapping[str, str] = field(default_factory=dict)
    """Field name -> why the page's value for it was refused (out of bounds, not a number)."""


class _NonsenseError(Exception):
    """A field's value on the page is nonsense."""


def parse_engine_metrics(text: str) -> EngineReading:
    """Normalise a Prometheus text page; EngineMetricsError if nothing known is in it."""
    values: dict[str, _Samples] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(_read_lines(text)):
            for sample in family.samples:
                if sample.name in _WANTED:
                    values[sample.name].append((sample.labels, float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise EngineMetricsError(f"not Prometheus text: {str(exc)[:120]}") from None
    engine = _engine(values)
    if engine is None:
        raise EngineMetricsError("no vLLM, SGLang or TGI queue metrics on the page")
    waiting, running, kv = _NAMES[engine]
    preemptions = next((values[n] for n in _PREEMPTIONS[engine] if n in values), None)
    capacity = _KV_CAPACITY[engine]
    rejected: dict[str, str] = {}
    return EngineReading(
        engine=engine,
        waiting=_guarded(rejected, "waiting", lambda: _count(values.get(waiting))),
        running=_guarded(rejected, "running", lambda: _count(values.get(running))),
        kv_usage=_guarded(
            rejected, "kv_usage", lambda: None if kv is None else _mean_fraction(values.get(kv))
        ),
        kv_capacity_tokens=_guarded(
            rejected, "kv_capacity_tokens", lambda: _kv_capacity(capacity, values)
        ),
        preemptions_total=_guarded(
            rejected, "preemptions_total", lambda: _per_engine_sum(preemptions, 0, MAX_PREEMPTIONS)
        ),
        rejected=rejected,
    )


def _read_lines(text: str) -> str:
    """The page's sample lines of the names the poller reads (``_WANTED``), as they came.

    A vLLM page is mostly histograms the poller reads nothing of: the emulator's, with vLLM's
    families, is 56 KiB in 543 lines, and prometheus_client's parser (pure Python) took 14 ms
    over it, every replica's page each interval, on the router's event loop. Picked by name
    first, a page reads in a fraction of that; a line that is read still goes through the
    parser whole, and one the poller does not read can no longer make the page unreadable.
    """
    kept = [
        line
        for line in text.splitlines()
        if line.startswith(_WANTED_PREFIXES) and line.split("{", 1)[0].split(None, 1)[0] in _WANTED
    ]
    return "\n".join(kept) + "\n" if kept else ""


def _guarded(rejected: dict[str, str], name: str, read: Callable[[], _T | None]) -> _T | None:
    """``read()``, or None with the reason in ``rejected`` when the value is nonsense."""
    try:
        return read()
    except _NonsenseError as exc:
        rejected[name] = str(exc)
        return None


def _engine(values: Mapping[str, object]) -> str | None:
    if "vllm:kv_cache_usage_perc" in values:
        return "vllm"
    if "vllm:gpu_cache_usage_perc" in values:
        return "vllm-deprecated"
    if any(name.startswith("vllm:") for name in values):
        return "vllm"
    for engine, prefix in (("sglang", "sglang:"), ("tgi", "tgi_")):
        if any(name.startswith(prefix) for name in values):
            return engine
    return None


def _count(samples: _Samples | None) -> int | None:
    """Requests, summed over samples (over a data-parallel server's engines)."""
    if not samples:
        return None
    for _, v in samples:
        _check(v, 0, MAX_ENGINE_REQUESTS)
    return round(_check(sum(v for _, v in samples), 0, MAX_ENGINE_REQUESTS))


def _mean_fraction(samples: _Samples | None) -> float | None:
    if not samples:
        return None
    for _, v in samples:
        _check(v, 0.0, MAX_KV_USAGE)
    return sum(v for _, v in samples) / len(samples)


def _kv_capacity(name: str | None, values: Mapping[str, _Samples]) -> int | None:
    samples = None if name is None else values.get(name)
    if not samples:
        return None
    if name == _VLLM_CACHE_INFO:
        figures = [(labels, _vllm_cache_tokens(labels)) for labels, _ in samples]
        if any(tokens is None for _, tokens in figures):
            return None  # an engine that has not sized its cache yet: the page does not say
        samples = [(labels, float(tokens)) for labels, tokens in figures if tokens is not None]
    return _per_engine_sum(samples, MIN_KV_CAPACITY_TOKENS, MAX_KV_CAPACITY_TOKENS)


def _vllm_cache_tokens(labels: Mapping[str, str]) -> int | None:
    """One vLLM engine's KV tokens from its cache-config labels; None if it does not say."""
    tokens = _label_int(labels, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks, block_size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    if blocks is None or block_size is None:
        return None
    return blocks * block_size


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    text = labels.get(key, "").strip()
    if text.lower() in _NOT_SAID:
        return None
    try:
        return int(text)
    except ValueError:
        raise _NonsenseError(f"{key}={text[:40]!r} is not a whole number") from None


def _per_engine_sum(samples: _Samples | None, low: int, high: int) -> int | None:
    """Sum over a data-parallel server's engines; samples of one engine (tensor- or
    pipeline-parallel ranks repeating the same figure) count once, at their largest."""
    if not samples:
        return None
    per_engine: dict[tuple[str, ...], float] = {}
    for labels, v in samples:
        _check(v, low, high)
        key = tuple(labels.get(label, "") for label in _ENGINE_LABELS)
        per_engine[key] = max(v, per_engine.get(key, v))
    return round(_check(sum(per_engine.values()), low, high))


def _check(value: float, low: float, high: float) -> float:
    if not low <= value <= high:  # NaN fails both comparisons
        raise _NonsenseError(f"{value!r} outside {low!r}..{high!r}")
    return value


class EngineMetricsPoller:
    """Reads every replica's ``/metrics`` each interval and sets ``Replica.engine``.

    A replica that does not answer keeps its last reading, which ages (``received_at``) until
    consumers stop trusting it; ``errors`` says why, per replica. A nonsense value on a page
    that otherwise reads keeps that field's last good value; ``rejected`` counts them.
    """

    def __init__(
        self,
        core: RouterCore,
        *,
        interval_s: float | None = None,
        timeout_s: float | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Clock | None = None,
    ) -> None:
        health = core.fleet.router.health
        self.core = core
        self.interval_s = health.engine_metrics_interval_s if interval_s is None else interval_s
        self.timeout = aiohttp.ClientTimeout(
            total=health.check_timeout_s if timeout_s is None else timeout_s
        )
        self.clock: Clock = core.clock if clock is None else clock
        self.errors: dict[str, str] = {}
        """Replica id -> why its latest poll failed (absent once one succeeds)."""
        self.rejected: dict[str, int] = {}
        """Replica id -> how many values its pages carried that were nonsense (out of bounds
        or not numbers), each refused and replaced by that field's last good value."""
        self.last_rejection: dict[str, str] = {}
        """Replica id -> the latest refused value and why (kept after later good pages)."""
        self.refusing: set[str] = set()
        """Replicas whose latest page read carried a refused value."""
        self._session = session
        self._own_session = session is None
        self._task: asyncio.Task[None] | None = None

    def status(self) -> EngineMetricsStatus:
        """Per replica: why its last poll failed, and the values refused as nonsense (how
        many, and the latest reason), for the admin state and the console."""
        return EngineMetricsStatus(
            errors=dict(self.errors),
            rejected=dict(self.rejected),
            last_rejection=dict(self.last_rejection),
            refusing=tuple(sorted(self.refusing)),
        )

    async def start(self) -> None:
        """Poll in the background; does nothing when the interval is 0."""
        if self._task is None and self.interval_s > 0:
            self._task = asyncio.create_task(self._run(), name="engine-metrics")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def poll_once(self) -> None:
        """Read every replica once, concurrently; tell the pool which readings changed."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        session = self._session
        readings = await asyncio.gather(*(self._poll(session, r) for r in self.core.pool))
        for replica, reading in zip(self.core.pool, readings, strict=True):
            if reading is not None:
                self.apply(replica, reading)
        self.core.engines_read()

    def apply(self, replica: Replica, reading: EngineReading) -> bool:
        """Set ``replica.engine`` from a reading, a refused field keeping its last good value;
        tells the pool when anything but the time stamp changed, and returns whether it did."""
        previous = replica.engine
        keep = reading.rejected.keys()
        if keep:
            self.rejected[replica.id] = self.rejected.get(replica.id, 0) + len(keep)
            self.last_rejection[replica.id] = "; ".join(
                f"{name}: {why}" for name, why in reading.rejected.items()
            )
            self.refusing.add(replica.id)
        else:
            self.refusing.discard(replica.id)
        last = previous if previous is not None else EngineLoad(reading.engine, received_at=0.0)
        load = EngineLoad(
            engine=reading.engine,
            received_at=self.clock(),
            waiting=last.waiting if "waiting" in keep else reading.waiting,
            running=last.running if "running" in keep else reading.running,
            kv_usage=last.kv_usage if "kv_usage" in keep else reading.kv_usage,
            kv_capacity_tokens=(
                last.kv_capacity_tokens
                if "kv_capacity_tokens" in keep
                else reading.kv_capacity_tokens
            ),
            preemptions_total=(
                last.preemptions_total if "preemptions_total" in keep else reading.preemptions_total
            ),
        )
        replica.engine = load
        changed = (
            previous is None or dataclasses.replace(previous, received_at=load.received_at) != load
        )
        if changed:
            self.core.pool.changed(replica)
        return changed

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def _poll(self, session: aiohttp.ClientSession, replica: Replica) -> EngineReading | None:
        url = replica.config.endpoint.rstrip("/") + "/metrics"
        try:
            async with session.get(url, timeout=self.timeout) as response:
                if response.status != 200:
                    raise EngineMetricsError(f"HTTP {response.status}")
                body = await response.content.read(MAX_METRICS_BYTES + 1)
            if len(body) > MAX_METRICS_BYTES:
                raise EngineMetricsError(f"over {MAX_METRICS_BYTES} bytes")
            reading = parse_engine_metrics(body.decode("utf-8", "replace"))
        except (aiohttp.ClientError, TimeoutError, EngineMetricsError) as exc:
            self.errors[replica.id] = f"{url}: {str(exc) or type(exc).__name__}"
            return None
        self.errors.pop(replica.id, None)
        return reading
