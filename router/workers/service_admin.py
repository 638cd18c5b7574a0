"""The admin API of a ``gpurouter serve --workers N``: one address for the whole service, in
the supervisor, answered from the workers' private APIs (private_api.py).

The same routes, token and browser guard as one router's admin API (router/http/admin.py):

- ``POST /admin/commands`` (service_commands.py): with a control link (telemetry on), to one
  worker, which publishes it as the cluster's desired state; every worker applies it from the
  broker, as every other router does, and a restarted worker gets it back (the state file
  the workers share, then the retained messages) before it opens its front door. With
  ``--no-telemetry``, to every worker that serves, each applying it to its own core, and kept
  by the supervisor as the service's desired state, which a restarted worker applies before
  it opens its front door. The answer is the first worker's, with ``workers``: each asked
  worker's status; 200 only when every one applied it, else the first refusal's status; 503
  when none answers.
- ``GET /admin/state`` is the first answering worker's state (a replica's ``in_flight`` and
  ``outstanding_cost`` are the whole service's in every worker), with what is each worker's
  own summed over the workers (the queue, outcomes, arrival and completion rates, and per
  replica completed, failed, retries and rates; ``running`` lists every worker's requests),
  and ``workers``: each one's pid, restarts and whether it answered. ``?worker=K`` answers
  that worker's own state alone.
- ``/admin/rollout`` and ``/admin/split`` (GET and POST) are worker 0's, relayed as they are
  (the same request and answer as one router's): worker 0 runs the service's rollouts and
  its traffic split, one at a time, and gives their drains, undrains, preemptions and
  splits the way an operator's command is given (above), so every worker applies them
  (docs/decisions/0007). 503 while worker 0 does not answer (it is restarting).
- ``GET /admin/events``, ``/admin/decisions``, ``/admin/fleet`` are the first answering
  worker's (every worker applies every command, so their trails hold the same commands; a
  restarted worker's trail starts again, in a new ``run``), or with ``?worker=K`` that
  worker's own. ``?follow=1`` streams.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode

import orjson

from router.http.admin import MAX_COMMAND_BYTES, token_refusal
from router.http.asgi import Receive, Scope, Send, header_map, read_body, send_bytes, send_error
from router.http.browser_guard import foreign_host, unsupported_media
from router.http.errors import HttpError
from router.workers.load_table import LoadTable
from router.workers.service_commands import ServiceCommands
from router.workers.worker_client import ROLLOUT_WORKER, UNREACHABLE, Answer, WorkerClient

__all__ = ["ServiceAdmin", "merge_states"]

_FORWARDED = ("content-type", "x-actor")
_PROXIED = frozenset(("/admin/events", "/admin/decisions", "/admin/fleet"))
_ROLLOUT_ROUTES = frozenset(("/admin/rollout", "/admin/split"))
ROLLOUT_TIMEOUT_S = 60.0
"""How long a rollout or split request relayed to worker 0 may take (a preview runs the
simulator; a split's step waits for its command to come back from every worker)."""
_NO_ROLLOUT_WORKER = HttpError(
    503,
    f"worker {ROLLOUT_WORKER}, which runs the service's rollouts and splits, did not answer "
    "(it may be restarting); ask again",
    "server_error",
    code="no_worker",
)
_NO_WORKER = HttpError(503, "no worker answered", "server_error", code="no_worker")
_SUMMED = ("arrivals_rps", "throughput_rps", "output_tokens_per_s", "in_flight")
_SUMMED_PER_REPLICA = (
    "completed", "failed", "retries", "throughput_rps", "output_tokens_per_s",
)  # fmt: skip


class ServiceAdmin:
    def __init__(
        self,
        client: WorkerClient,
        table: LoadTable,
        token: str | None,
        *,
        broadcast: bool,
        commands: ServiceCommands | None = None,
    ) -> None:
        """``broadcast``: give a command to every worker (no control link); else to one,
        whose control link publishes it as desired state, which every worker applies.
        ``commands``: the supervisor's (shared with its own socket, supervisor_api.py)."""
        self.broadcast = broadcast
        self.client = client
        self.table = table
        self.commands = commands or ServiceCommands(client, table, broadcast=broadcast)
        self._token = None if token is None else token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = header_map(scope)
        refusal = foreign_host(scope, headers) or token_refusal(self._token, headers)
        if refusal is not None:
            await send_error(send, refusal, [(b"www-authenticate", b"Bearer")])
            return
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        target = scope["path"] + (f"?{scope['query_string'].decode()}" if query else "")
        try:
            match (scope["method"], scope["path"]):
                case ("GET", "/admin/state") if "worker" in query:
                    await self._from_worker(send, _int(query["worker"]), target)
                case ("GET", "/admin/state"):
                    await self._state(send, target)
                case ("POST", "/admin/commands"):
                    await self._command(receive, send, headers)
                case ("GET", path) if path in _PROXIED and "worker" in query:
                    await self._proxy(send, _without_worker(target), [self._index(query)])
                case ("GET", path) if path in _PROXIED:
                    await self._proxy(send, target, self.serving())
                case ("GET" | "POST", path) if path in _ROLLOUT_ROUTES:
                    await self._rollout(scope, receive, send, headers, target)
                case _:
                    raise HttpError(404, f"no route {scope['path']}", code="not_found")
        except HttpError as exc:
            await send_error(send, exc)

    def serving(self) -> list[int]:
        """The workers that serve now (their pid is in the table)."""
        return [i for i in range(self.table.workers) if self.table.pid(i)]

    async def _rollout(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], target: str
    ) -> None:
        """Relay a rollout or split request to the worker that runs them, as it is."""
        body: bytes | None = None
        if scope["method"] == "POST":
            media = unsupported_media(headers)
            if media is not None:
                raise media
            body = await read_body(receive, headers, MAX_COMMAND_BYTES)
        forwarded = {k: headers[k] for k in _FORWARDED if k in headers}
        answer = await self._ask(
            ROLLOUT_WORKER,
            scope["method"],
            target,
            body=body,
            headers=forwarded,
            timeout_s=ROLLOUT_TIMEOUT_S,
        )
        if answer is None:
            raise _NO_ROLLOUT_WORKER
        await _relay(send, answer)

    async def _ask(self, index: int, method: str, path: str, **kw: Any) -> Answer | None:
        try:
            return await self.client.request(index, method, path, **kw)
        except UNREACHABLE:
            return None

    def _index(self, query: dict[str, str]) -> int:
        index = _int(query["worker"])
        if not 0 <= index < self.table.workers:
            raise HttpError(404, f"no worker {index}", code="not_found")
        return index

    async def _from_worker(self, send: Send, index: int, target: str) -> None:
        if not 0 <= index < self.table.workers:
            raise HttpError(404, f"no worker {index}", code="not_found")
        answer = await self._ask(index, "GET", _without_worker(target))
        if answer is None:
            raise HttpError(503, f"worker {index} did not answer", "server_error", code="no_worker")
        await _relay(send, answer)

    async def _state(self, send: Send, target: str) -> None:
        indexes = range(self.table.workers)
        answers = await asyncio.gather(*(self._ask(i, "GET", target) for i in indexes))
        states = {i: orjson.loads(a.body) for i, a in zip(indexes, answers, strict=True) if a}
        states = {i: s for i, s in states.items() if isinstance(s, dict)}
        if not states:
            raise _NO_WORKER
        merged = merge_states(list(states.values()))
        merged["workers"] = [
            {
                "index": i,
                "pid": self.table.pid(i) or None,
                "restarts": self.table.restarts(i),
                "answered": i in states,
            }
            for i in indexes
        ]
        await send_bytes(send, 200, orjson.dumps(merged), b"application/json")

    async def _command(self, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        media = unsupported_media(headers)
        if media is not None:
            raise media
        body = await read_body(receive, headers, MAX_COMMAND_BYTES)
        forwarded = {k: headers[k] for k in _FORWARDED if k in headers}
        given = await self.commands.give(body, forwarded)
        first = given.first()
        if first is None:
            raise _NO_WORKER
        got = [a for _, a in sorted(given.answers.items()) if a is not None]
        chosen = next((a for a in got if a.status != 200), first[1])
        data = orjson.loads(chosen.body)
        if isinstance(data, dict):
            data["workers"] = given.statuses()
        await send_bytes(send, chosen.status, orjson.dumps(data), b"application/json")

    async def _proxy(self, send: Send, target: str, indexes: list[int]) -> None:
        """The first of ``indexes`` that answers, relayed as it comes."""
        for index in indexes:
            try:
                await self._stream(index, target, send)
            except UNREACHABLE:
                continue
            return
        raise _NO_WORKER

    async def _stream(self, index: int, target: str, send: Send) -> None:
        """Relay a worker's answer as it comes (an event stream that follows never ends)."""
        session = self.client.session(index)
        async with session.get(f"http://worker{target}", timeout=None) as response:
            headers = [
                (k.lower().encode(), v.encode())
                for k, v in response.headers.items()
                if k.lower() in ("content-type", "cache-control", "x-gpurouter-run")
            ]
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _without_worker(target: str) -> str:
    """``target`` without its ``worker`` parameter (the service's, not the worker's)."""
    path, _, qs = target.partition("?")
    rest = urlencode([(k, v) for k, v in parse_qsl(qs) if k != "worker"])
    return f"{path}?{rest}" if rest else path


async def _relay(send: Send, answer: Answer) -> None:
    await send_bytes(send, answer.status, answer.body, answer.content_type.encode())


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise HttpError(400, "`worker` must be an integer", code="invalid_request") from None


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The first worker's state, with what each worker counts of its own summed."""
    merged = dict(states[0])
    for key in _SUMMED:
        merged[key] = sum(s.get(key) or 0 for s in states)
    merged["outcomes"] = _sum_maps([s.get("outcomes") or {} for s in states])
    queue = dict(merged.get("queue") or {})
    queue["depth"] = sum((s.get("queue") or {}).get("depth", 0) for s in states)
    queue["capacity"] = sum((s.get("queue") or {}).get("capacity", 0) for s in states)
    queue["by_priority"] = _sum_maps(
        [(s.get("queue") or {}).get("by_priority") or {} for s in states]
    )
    merged["queue"] = queue
    by_id = [{r["id"]: r for r in s.get("replicas", [])} for s in states]
    replicas = []
    for replica in merged.get("replicas", []):
        r = dict(replica)
        for key in _SUMMED_PER_REPLICA:
            r[key] = sum((b.get(r["id"]) or {}).get(key) or 0 for b in by_id)
        replicas.append(r)
    merged["replicas"] = replicas
    if "running" in merged:
        running: dict[str, list[Any]] = {}
        for s in states:
            for rid, items in (s.get("running") or {}).items():
                running.setdefault(rid, []).extend(items)
        merged["running"] = running
    merged.pop("worker", None)
    return merged


def _sum_maps(maps: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for m in maps:
        for k, v in m.items():
            total[k] = total.get(k, 0) + v
    return total
