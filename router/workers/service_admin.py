"""The admin API of a ``gpurouter serve --workers N``: one address for the whole service, in
the supervisor, answered from the workers' private APIs (private_api.py).

The same routes, token and browser guard as one router's admin API (router/http/admin.py):

- ``POST /admin/commands``: with a control link (telemetry on), to one worker, which
  publishes it as the cluster's desired state; every worker applies it from the broker, as
  every other router does, and a restarted worker gets it back from the retained message.
  With ``--no-telemetry``, to every worker that serves, each applying it to its own core (a
  worker restarted later starts from the fleet file's settings: see the decision record).
  The answer is the first worker's, with ``workers``: each asked worker's status; 200 only
  when every one applied it, else the first refusal's status; 503 when none answers.
- ``GET /admin/state`` is the first answering worker's state (a replica's ``in_flight`` and
  ``outstanding_cost`` are the whole service's in every worker), with what is each worker's
  own summed over the workers (the queue, outcomes, arrival and completion rates, and per
  replica completed, failed, retries and rates; ``running`` lists every worker's requests),
  and ``workers``: each one's pid, restarts and whether it answered. ``?worker=K`` answers
  that worker's own state alone.
- ``/admin/rollout`` and ``/admin/split`` answer 404 saying to serve with ``--workers 1``: a
  rollout's drains and a split are not shared between workers yet.
- ``GET /admin/events``, ``/admin/decisions``, ``/admin/fleet`` are the first answering
  worker's (every worker applies every command, so their trails hold the same commands; a
  restarted worker's trail starts again, in a new ``run``). ``?follow=1`` streams.
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
from router.workers.worker_client import UNREACHABLE, Answer, WorkerClient

__all__ = ["ServiceAdmin", "merge_states"]

_FORWARDED = ("content-type", "x-actor")
_PROXIED = frozenset(("/admin/events", "/admin/decisions", "/admin/fleet"))
_NO_ROLLOUTS = (
    "rollouts run in a single router process for now: serve the fleet with --workers 1 to "
    "roll it (docs/rollouts.md)"
)
_NO_WORKER = HttpError(503, "no worker answered", "server_error", code="no_worker")
_SUMMED = ("arrivals_rps", "throughput_rps", "output_tokens_per_s", "in_flight")
_SUMMED_PER_REPLICA = (
    "completed", "failed", "retries", "throughput_rps", "output_tokens_per_s",
)  # fmt: skip


class ServiceAdmin:
    def __init__(
        self, client: WorkerClient, table: LoadTable, token: str | None, *, broadcast: bool
    ) -> None:
        """``broadcast``: give a command to every worker (no control link); else to one,
        whose control link publishes it as desired state, which every worker applies."""
        self.broadcast = broadcast
        self.client = client
        self.table = table
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
                case ("GET", path) if path in _PROXIED:
                    await self._proxy(send, target)
                case (_, "/admin/rollout" | "/admin/split"):
                    # A rollout's drains would hold in the worker running it alone, and the
                    # others would keep sending to a replica being restarted.
                    raise HttpError(404, _NO_ROLLOUTS, code="not_found")
                case _:
                    raise HttpError(404, f"no route {scope['path']}", code="not_found")
        except HttpError as exc:
            await send_error(send, exc)

    def serving(self) -> list[int]:
        """The workers that serve now (their pid is in the table)."""
        return [i for i in range(self.table.workers) if self.table.pid(i)]

    async def _ask(self, index: int, method: str, path: str, **kw: Any) -> Answer | None:
        try:
            return await self.client.request(index, method, path, **kw)
        except UNREACHABLE:
            return None

    async def _from_worker(self, send: Send, index: int, target: str) -> None:
        if not 0 <= index < self.table.workers:
            raise HttpError(404, f"no worker {index}", code="not_found")
        path, _, qs = target.partition("?")
        rest = urlencode([(k, v) for k, v in parse_qsl(qs) if k != "worker"])
        answer = await self._ask(index, "GET", f"{path}?{rest}" if rest else path)
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
        indexes = self.serving()
        if not self.broadcast:
            indexes = indexes[:1]
        answers = await asyncio.gather(
            *(
                self._ask(i, "POST", "/admin/commands", body=body, headers=forwarded)
                for i in indexes
            )
        )
        got = [(i, a) for i, a in zip(indexes, answers, strict=True) if a is not None]
        if not got:
            raise _NO_WORKER
        first = got[0][1]
        failed = next((a for _, a in got if a.status != 200), None)
        chosen = failed or first
        data = orjson.loads(chosen.body)
        if isinstance(data, dict):
            data["workers"] = {
                str(i): (a.status if a else None) for i, a in zip(indexes, answers, strict=True)
            }
        await send_bytes(send, chosen.status, orjson.dumps(data), b"application/json")

    async def _proxy(self, send: Send, target: str) -> None:
        for index in self.serving():
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
