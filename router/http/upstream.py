"""The upstream side of the data plane: one aiohttp session, warm connections to every replica.

One ``aiohttp.ClientSession`` lives as long as the router (docs/decisions/0001-http-stack.md):
its ``TCPConnector`` keeps a keep-alive pool per replica (per host and port), bounded in all
by ``server.upstream_connections`` or, by default, the sum of the replicas' batch sizes plus
one per replica for health probes (the router never has more requests in flight than its
batch sizes allow). Timeouts come from ``router.timeouts``:

- ``connect_s``: opening a connection;
- ``first_byte_s``: waiting for the answer (aiohttp's per-read timeout, so it also bounds
  the silence between two chunks; the silence watch, ``health.stream_idle_max_s`` and
  router/http/silence.py, ends a silent stream long before);
- ``total_s``: the whole request.

Health checking probes through the same pool: ``probe`` (``GET /health``) and ``generate``
(a one-token completion: the only probe a frozen engine fails).

Responses are not decompressed: bytes pass through as the replica wrote them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
import orjson

from router.config.schema import FleetConfig

__all__ = ["PROBE_REQUEST_ID", "Upstream", "failure_reason"]

PROBE_REQUEST_ID = "gpurouter-probe"
"""``X-Request-ID`` of generation probes, so that a replica's logs tell them apart."""


class Upstream:
    """The connection pool to the replicas; ``start`` on the router's loop, ``close`` at exit."""

    def __init__(self, fleet: FleetConfig) -> None:
        server, timeouts = fleet.server, fleet.router.timeouts
        replicas = fleet.replicas
        self.limit = server.upstream_connections or (
            sum(r.batch_size for r in replicas) + len(replicas)
        )
        self.keepalive_s = server.keepalive_s
        self.timeout = aiohttp.ClientTimeout(
            total=timeouts.total_s,
            sock_connect=timeouts.connect_s,
            sock_read=timeouts.first_byte_s,
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream pool is not started")
        return self._session

    async def start(self) -> None:
        if self._session is not None:
            return
        connector = aiohttp.TCPConnector(
            limit=self.limit, limit_per_host=0, keepalive_timeout=self.keepalive_s
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self.timeout,
            auto_decompress=False,
            # Replicas need no cookies; a shared jar would leak one client's to another.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str]
    ) -> aiohttp.client._RequestContextManager:
        """Send ``body`` to ``url``; use as ``async with upstream.post(...) as response``."""
        return self.session.post(url, data=body, headers=headers)

    async def probe(self, url: str, timeout_s: float) -> str | None:
        """GET ``url``; None when it answered 2xx in time, else what went wrong."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(url, timeout=timeout) as response:
                await response.read()
                if response.status >= 300:
                    return f"health check answered {response.status}"
                return None
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"health check failed: {failure_reason(exc)}"

    async def generate(self, url: str, model: str, timeout_s: float) -> str | None:
        """POST a one-token completion of ``model`` to ``url``; None when the replica
        generated it in time, else what went wrong."""
        body = orjson.dumps({"model": model, "prompt": "ping", "max_tokens": 1})
        headers = {"content-type": "application/json", "x-request-id": PROBE_REQUEST_ID}
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.post(
                url, data=body, headers=headers, timeout=timeout
            ) as response:
                await response.read()
                if response.status >= 300:
                    return f"generation probe answered {response.status}"
                return None
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"generation probe failed: {failure_reason(exc)}"


def failure_reason(exc: BaseException) -> str:
    """A short, stable description of an upstream exception (for reasons and logs)."""
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        text = str(exc)
        return f"timed out ({text})" if text else "timed out"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the replica closed the connection"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the replica's answer was cut short"
    return f"{type(exc).__name__}: {exc}"
