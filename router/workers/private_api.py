"""A worker's private API, on a Unix socket in a directory only the service's user can open:
the router's admin API as it is (no token: the service's own admin API checked the
caller's), its ``/admin/state`` with what this worker itself holds, and its own Prometheus
text (``GET /worker/metrics``) for whichever worker answers the service's /metrics."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from router.http.admin import AdminApi
from router.http.asgi import Receive, Scope, Send, send_bytes, send_json
from router.http.metrics import CONTENT_TYPE

__all__ = ["OWN_METRICS", "PrivateApi"]

OWN_METRICS = "/worker/metrics"


class PrivateApi:
    def __init__(self, admin: AdminApi, index: int, own_metrics: Callable[[], bytes]) -> None:
        self.admin = admin
        self.index = index
        self.own_metrics = own_metrics

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
            case _:
                await self.admin(scope, receive, send)

    def state(self, running: bool) -> dict[str, Any]:
        """The admin API's state, and what this worker alone holds on each replica (the
        replicas' ``in_flight`` counts every worker's)."""
        data = self.admin.state(running=running)
        own = {r.id: r.own_in_flight for r in self.admin.core.pool}
        data["worker"] = {"index": self.index, "pid": os.getpid(), "own_in_flight": own}
        return data
