"""The supervisor's own API, for its workers only: on a Unix socket (``<dir>/service.sock``) in
the directory only the service's user can open, so it takes no token.

- ``POST /service/commands``: a control command (the JSON ``POST /admin/commands`` takes, its
  actor in ``X-Actor``) given to the workers the way the service's admin API gives an
  operator's (service_commands.py). The worker that runs the service's rollouts gives its
  drains, undrains, preemptions and splits here when there is no control link, so that every
  worker applies them and the service keeps them as desired state. The answer is the asking
  worker's own application of it (the event, as ``/admin/commands`` answers it, 200 applied,
  409 refused) with ``workers``: each worker's status.
- ``GET /service/desired?worker=K``: worker ``K`` starts; the service's desired state for it
  to apply before it opens its front door (``{"desired": [{"command", "actor"}, ...]}``,
  oldest first; empty with a control link, where the broker holds it).
"""

from __future__ import annotations

from urllib.parse import parse_qs

import orjson

from router.http.admin import MAX_COMMAND_BYTES
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
from router.workers.service_commands import ServiceCommands

__all__ = ["SupervisorApi"]

_FORWARDED = ("content-type", "x-actor")


class SupervisorApi:
    def __init__(self, commands: ServiceCommands) -> None:
        self.commands = commands

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        headers = header_map(scope)
        try:
            match (scope["method"], scope["path"]):
                case ("POST", "/service/commands"):
                    await self._command(receive, send, headers, query)
                case ("GET", "/service/desired"):
                    index = _worker(query)
                    desired = await self.commands.join(index) if self.commands.broadcast else []
                    await send_json(send, 200, {"desired": desired})
                case _:
                    raise HttpError(404, f"no route {scope['path']}", code="not_found")
        except HttpError as exc:
            await send_error(send, exc)

    async def _command(
        self, receive: Receive, send: Send, headers: dict[str, str], query: dict[str, str]
    ) -> None:
        body = await read_body(receive, headers, MAX_COMMAND_BYTES)
        asking = _worker(query)
        forwarded = {k: headers[k] for k in _FORWARDED if k in headers}
        given = await self.commands.give(body, forwarded)
        own = given.answers.get(asking)
        if own is None:
            raise HttpError(503, f"worker {asking} was not given the command", code="no_worker")
        data = orjson.loads(own.body)
        if isinstance(data, dict):
            data["workers"] = given.statuses()
        await send_bytes(send, own.status, orjson.dumps(data), b"application/json")


def _worker(query: dict[str, str]) -> int:
    try:
        return int(query["worker"])
    except (KeyError, ValueError):
        raise HttpError(400, "`worker` must be a worker's index", code="invalid_request") from None
