"""Engine load from each replica's own ``/metrics``: one signal per replica, whatever engine.

Engines name the same things differently, and names change between versions (old cards often
pin old vLLM), so the poller normalises them:

- vLLM (V1, 0.10 and later): ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc``;
- older vLLM: the same queue names, KV usage as ``vllm:gpu_cache_usage_perc``;
- SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``;
- TGI: ``tgi_queue_size``, ``tgi_batch_current_size``; no KV-cache usage.

A vLLM server with data parallelism reports one sample per engine (label ``engine``): the
queue is their sum, KV usage their mean. Where both KV names appear, the current one wins.

:class:`EngineMetricsPoller` reads every replica each ``engine_metrics_interval_s`` (fleet
file, ``router.health``) with aiohttp and sets ``Replica.engine``
(:class:`~router.replica.EngineLoad`), stamped with the router's clock: the capacity-aware
strategy takes its KV usage from there while it is fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from router.clock import Clock
from router.core import RouterCore
from router.errors import TelemetryError
from router.replica import EngineLoad, Replica

MAX_METRICS_BYTES = 4 * 1024 * 1024
"""A /metrics page larger than this is refused unread (vLLM's is tens of KiB)."""

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
_WANTED = frozenset(n for names in _NAMES.values() for n in names if n is not None)


class EngineMetricsError(TelemetryError):
    """A replica's /metrics could not be read or carried none of the known names."""

    title = "engine metrics unreadable"


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One replica's engine load, normalised."""

    engine: str
    waiting: int | None
    running: int | None
    kv_usage: float | None


def parse_engine_metrics(text: str) -> EngineReading:
    """Normalise a Prometheus text page; EngineMetricsError if nothing known is in it."""
    values: dict[str, list[float]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in _WANTED and math.isfinite(sample.value):
                    values[sample.name].append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise EngineMetricsError(f"not Prometheus text: {str(exc)[:120]}") from None
    engine = _engine(values)
    if engine is None:
        raise EngineMetricsError("no vLLM, SGLang or TGI queue metrics on the page")
    waiting, running, kv = _NAMES[engine]
    return EngineReading(
        engine=engine,
        waiting=_total(values.get(waiting)),
        running=_total(values.get(running)),
        kv_usage=None if kv is None else _mean_fraction(values.get(kv)),
    )


def _engine(values: Mapping[str, list[float]]) -> str | None:
    if "vllm:kv_cache_usage_perc" in values:
        return "vllm"
    if "vllm:gpu_cache_usage_perc" in values:
        return "vllm-deprecated"
    if "vllm:num_requests_waiting" in values or "vllm:num_requests_running" in values:
        return "vllm"
    for engine in ("sglang", "tgi"):
        if any(name in values for name in _NAMES[engine] if name is not None):
            return engine
    return None


def _total(samples: list[float] | None) -> int | None:
    return None if not samples else max(0, round(sum(samples)))


def _mean_fraction(samples: list[float] | None) -> float | None:
    return None if not samples else min(1.0, max(0.0, sum(samples) / len(samples)))


class EngineMetricsPoller:
    """Reads every replica's ``/metrics`` each interval and sets ``Replica.engine``.

    A replica that does not answer keeps its last reading, which ages (``received_at``) until
    consumers stop trusting it; ``errors`` says why, per replica.
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
        self._session = session
        self._own_session = session is None
        self._task: asyncio.Task[None] | None = None

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
        """Read every replica once, concurrently."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        session = self._session
        await asyncio.gather(*(self._poll(session, r) for r in self.core.pool))
        if len(self.core.queue):
            self.core.dispatch()  # freed KV cache may let a waiting request go now

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)

    async def _poll(self, session: aiohttp.ClientSession, replica: Replica) -> None:
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
            return
        self.errors.pop(replica.id, None)
        replica.engine = EngineLoad(
            engine=reading.engine,
            received_at=self.clock(),
            waiting=reading.waiting,
            running=reading.running,
            kv_usage=reading.kv_usage,
        )
