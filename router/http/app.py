"""The front door: a raw ASGI app with the OpenAI-compatible routes and the probes.

| route | answer |
|---|---|
| ``POST /v1/chat/completions``, ``POST /v1/completions`` | proxied to a replica (proxy.py) |
| ``GET /v1/models`` | what the replicas serve (served_models.py) |
| ``GET /health`` | 200 while the process serves |
| ``GET /ready`` | 200 while a replica in service answers (health.py), else 503 |
| ``GET /metrics`` | Prometheus text (metrics.py) |

Anything else is a 404 (or 405 for a known path with the wrong method) in OpenAI's error
format. No framework: the hot path is one dict lookup away from the proxy. Every answer is
counted by route, status and reason (router/http/responses.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from router.core import RouterCore
from router.http.asgi import (
    CountedSend,
    Receive,
    Scope,
    Send,
    note_reason,
    send_bytes,
    send_error,
    send_json,
)
from router.http.errors import HttpError
from router.http.metrics import CONTENT_TYPE, RouterMetrics
from router.http.proxy import Proxy
from router.http.responses import OTHER_ROUTE

__all__ = ["FrontDoor"]

log = logging.getLogger("gpurouter.http")

Route = Callable[[Scope, Receive, Send], Awaitable[None]]


class FrontDoor:
    def __init__(self, proxy: Proxy, core: RouterCore, metrics: RouterMetrics) -> None:
        self.proxy = proxy
        self.core = core
        self.metrics = metrics
        self.created = int(time.time())
        self.render_metrics: Callable[[], Awaitable[bytes]] | None = None
        """What ``/metrics`` answers when not this router's own: the whole service's, where
        several worker processes share the front door (router/workers/service_metrics.py)."""
        self.routes: dict[str, tuple[str, Route]] = {
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completion),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
            "/ready": ("GET", self._ready),
            "/metrics": ("GET", self._metrics),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not served
        path = scope["path"]
        counted = CountedSend(send)
        try:
            await self._route(scope, receive, counted)
        finally:  # a handler cancelled (its client left) is counted too, as answered so far
            self.metrics.responses.count(path if path in self.routes else OTHER_ROUTE, counted)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"])
        if route is None:
            await send_error(send, HttpError(404, f"no route {scope['path']}", code="not_found"))
            return
        method, handler = route
        if scope["method"] != method and not (method == "GET" and scope["method"] == "HEAD"):
            error = HttpError(405, f"{scope['path']} takes {method}", code="method_not_allowed")
            await send_error(send, error, [(b"allow", method.encode())])
            return
        try:
            await handler(scope, receive, send)
        except Exception:  # the probes and listings answer in one send: nothing went out yet
            log.exception("%s %s failed", scope["method"], scope["path"])
            await send_error(send, HttpError(500, "internal router error", "server_error"))

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.proxy.handle("chat", scope, receive, send)

    async def _completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.proxy.handle("completion", scope, receive, send)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        cards = [
            {"id": model, "object": "model", "created": self.created, "owned_by": "gpurouter"}
            for model in self.proxy.models.names()
        ]
        await send_json(send, 200, {"object": "list", "data": cards})

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"})

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.proxy.health.readiness()
        if not body["ready"]:
            note_reason(send, "not_ready")
        await send_json(send, 200 if body["ready"] else 503, body)

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        render = self.render_metrics
        body = self.metrics.render() if render is None else await render()
        await send_bytes(send, 200, body, CONTENT_TYPE.encode())
