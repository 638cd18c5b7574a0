"""A worker's private API, on a Unix socket in a directory only the service's user can open:
the router's admin API as it is (no token: the service's own admin API checked the
caller's), its ``/admin/state`` with what this worker itself holds, and its own Prometheus
text (``GET /worker/metrics``) for whichever worker answers the service's /metrics.

``/admin/rollout`` and ``/admin/split`` are worker 0's in every worker (another worker relays
them there as they are): the service runs one rollout and one split at a time, in worker 0,
whichever worker is asked (docs/decisions/0007)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from router.http.admin import MAX_COMMAND_BYTES, AdminApi
from router.http.asgi import (
    Receive,
    Scope,
    Send,
    header_map,
    read_body,
    send_bytes,
    send_error,
    send_json,
)
from router.http.errors import HttpError
from router.http.metrics import CONTENT_TYPE
from router.workers.worker_client import ROLLOUT_WORKER, UNREACHABLE, WorkerClient

__all__ = ["OWN_METRICS", "PrivateApi"]

OWN_METRICS = "/worker/metrics"
_ROLLOUT_ROUTES = frozenset(("/admin/rollout", "/admin/split"))
_RELAY_TIMEOUT_S = 60.0
_FORWARDED = ("content-type", "x-actor")


class PrivateApi:
    def __init__(
        self,
        admin: AdminApi,
        index: int,
        own_metrics: Callable[[], bytes],
        siblings: WorkerClient | None = None,
    ) -> None:
        """``siblings``: how to reach worker 0, to which another worker relays the rollout
        and split routes (None: answered here)."""
        self.admin = admin
        self.index = index
        self.own_metrics = own_metrics
        self.siblings = siblings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        match (scope["method"], scope["path"]):
            case ("GET", "/worker/metrics"):
                await send_bytes(send, 200, self.own_metrics(), CONTENT_TYPE.encode())
            case ("GET", "/admin/state"):
                query = parse_qs(scope.get("query_string", b"").decode())
                running = query.get("running", [""])[-1] in ("1", "true", "yes")
                await send_json(send, 200, self.state(running))
            case (_, path) if path in _ROLLOUT_ROUTES and self._relays():
                try:
                    await self._relay(scope, receive, send)
                except HttpError as exc:
                    await send_error(send, exc)
            case _:
                await self.admin(scope, receive, send)

    def _relays(self) -> bool:
        return self.siblings is not None and self.index != ROLLOUT_WORKER

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Ask worker 0, and answer what it answered."""
        assert self.siblings is not None
        headers = header_map(scope)
        body = await read_body(receive, headers, MAX_COMMAND_BYTES)
        query = scope.get("query_string", b"").decode()
        target = scope["path"] + (f"?{query}" if query else "")
        try:
            answer = await self.siblings.request(
                ROLLOUT_WORKER,
                scope["method"],
                target,
                body=body or None,
                headers={k: headers[k] for k in _FORWARDED if k in headers},
                timeout_s=_RELAY_TIMEOUT_S,
            )
        except UNREACHABLE:
            raise HttpError(
                503,
                f"worker {ROLLOUT_WORKER}, which runs the service's rollouts, did not answer",
                "server_error",
                code="no_worker",
            ) from None
        await send_bytes(send, answer.status, answer.body, answer.content_type.encode())

    def state(self, running: bool) -> dict[str, Any]:
        """The admin API's state, and what this worker alone holds on each replica (the
        replicas' ``in_flight`` counts every worker's)."""
        data = self.admin.state(running=running)
        own = {r.id: r.own_in_flight for r in self.admin.core.pool}
        data["worker"] = {"index": self.index, "pid": os.getpid(), "own_in_flight": own}
        return data
