"""The attempt loop: one client request, its attempts on replicas, and the relay of the answer.

A handler reads the body once, submits the request to the core (through the AsyncRouter's
ticket) and then follows the ticket's events: each :class:`~router.core.Assignment` is an
attempt on a replica, the :class:`~router.core.Finished` ends the request. An attempt:

- forwards the original body bytes to the replica, with ``X-Request-ID``;
- on a connect error, a timeout, a 5xx or a cut connection *before anything reached the
  client*, tells health checking, waits the backoff and hands the failure to the core, which
  re-queues the request for another replica (up to ``router.retries.attempts``) or fails it;
- relays a streamed answer (SSE) chunk by chunk as it arrives; a non-streamed answer (a small
  JSON body) is read whole first, so a replica that dies mid-body is retried too;
- after the first byte reached the client nothing is retried: a failure ends the SSE stream
  with an explicit ``data: {"error": ...}`` event;
- a 4xx from the replica is the request's fault: relayed as it is, not retried;
- a stream is a success once it relayed ``data: [DONE]``: a client that hangs up while the
  replica ends its body got the whole answer;
- while it waits on the replica it is registered with the silence watch
  (router/http/silence.py): silence past the replica's idle limit gets the replica probed,
  and health checking stops the attempt only when the probe finds the replica stuck (a
  stream ends with an error event; an attempt that has sent nothing to its client is re-run
  elsewhere, as after a connect error). A replica found working keeps every stream.

A preemption cancels the running attempt (the core re-queues or fails the request and says so
on the ticket); a client that disconnects cancels the handler, which closes the upstream
connection and ends the request in the core. Noticing a disconnect takes a task that waits on
the ASGI ``receive``; a request gets one only once it has run for ``watch_after_s`` (0.1 s),
so the many requests that end sooner cost no task, and a client that leaves earlier is
noticed when its watcher starts: its upstream request runs at most that much longer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import TYPE_CHECKING

import aiohttp
import orjson

from router.core import Assignment, Finished, Outcome
from router.http.asgi import (
    ClientGoneError,
    Receive,
    Scope,
    Send,
    header_map,
    note_reason,
    read_body,
    send_error,
)
from router.http.errors import (
    HttpError,
    deadline_passed,
    model_not_found,
    no_replica,
    queue_full,
    upstream_failed,
)
from router.http.parse import parse_request, request_id
from router.http.served_models import ServedModels
from router.http.upstream import failure_reason
from router.replica import ReplicaState
from router.request import Request

if TYPE_CHECKING:
    from router.http.driver import AsyncRouter, Ticket
    from router.http.health import HealthMonitor
    from router.http.metrics import RouterMetrics
    from router.http.upstream import Upstream

__all__ = ["REPLICA_HEADER", "Proxy"]

log = logging.getLogger("gpurouter.http")

REPLICA_HEADER = b"x-gpurouter-replica"
SHUTTING_DOWN = "the router is shutting down"
CLIENT_GONE = "client_gone"
"""The reason counted for a request whose client left (responses.py)."""
WATCH_AFTER_S = 0.1
"""How long a request runs before a task watches its client for a disconnect."""

_HEADERS = frozenset(
    (b"content-length", b"x-request-id", b"x-priority", b"x-session-id", b"authorization")
)
"""The request headers the proxy reads."""

Failure = tuple[str, bool]
"""(reason, whether the replica is to blame: counted by health checking and retried)."""


class Proxy:
    """Shared by every request of the front door."""

    def __init__(
        self,
        router: AsyncRouter,
        upstream: Upstream,
        health: HealthMonitor,
        metrics: RouterMetrics,
        *,
        watch_after_s: float = WATCH_AFTER_S,
        models: ServedModels | None = None,
    ) -> None:
        """``models``: what each replica serves (router/http/served_models.py); by default
        the fleet file's declarations, never asked."""
        self.router = router
        self.core = core = router.core
        self.upstream = upstream
        self.health = health
        self.metrics = metrics
        fleet = core.fleet
        self.limit = fleet.server.max_body_bytes
        self.default_max_tokens = core.settings.cost.default_max_tokens
        self.models = models if models is not None else ServedModels(core, interval_s=0)
        self.bases = [r.config.endpoint.rstrip("/") for r in core.pool]
        self.active: set[asyncio.Task[None]] = set()
        """Handlers in progress, so that stopping can wait for them."""
        self.watch_after_s = watch_after_s
        """A request that runs this long gets a task watching for its client's disconnect."""
        self._prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)

    def backoff_s(self, attempts: int) -> float:
        r = self.core.settings.retries
        return float(min(r.backoff_s * 2 ** (attempts - 1), r.backoff_max_s))

    async def handle(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ``/v1/completions`` (``completion``) or ``/v1/chat/completions`` (``chat``)."""
        headers = header_map(scope, _HEADERS)
        try:
            rid = request_id(headers) or f"gr-{self._prefix}-{next(self._ids)}"
        except HttpError as exc:
            await send_error(send, exc)  # not echoed: it is what was wrong
            return
        echo = [(b"x-request-id", rid.encode("latin-1"))]
        try:
            body = await read_body(receive, headers, self.limit)
            parsed = parse_request(kind, body, headers, self.default_max_tokens)
            self._check_model(parsed.model)
        except HttpError as exc:
            await send_error(send, exc, echo)
            return
        except ClientGoneError:
            note_reason(send, CLIENT_GONE)
            return
        core_id = rid
        if core_id in self.core.running or core_id in self.core.queue:
            core_id = f"{rid}#{next(self._ids)}"  # a client reused its id: keep ours unique
        request = Request(
            core_id,
            parsed.prompt_tokens,
            parsed.max_tokens,
            arrival=self.core.clock(),
            priority=parsed.priority,
            affinity_key=parsed.affinity_key,
            model=parsed.model,
        )
        up_headers = {"content-type": "application/json", "x-request-id": rid}
        if "authorization" in headers:
            up_headers["authorization"] = headers["authorization"]
        task = asyncio.current_task()
        assert task is not None
        ex = Exchange(self, task, send, scope["path"], body, up_headers, echo)
        self.active.add(task)
        ticket = self.router.submit(request)
        ticket.attempt_cancelled = ex.on_attempt_cancelled
        timer = task.get_loop().call_later(self.watch_after_s, ex.start_watching, receive)
        try:
            await ex.run(ticket)
        except asyncio.CancelledError:
            if ex.client_gone:
                task.uncancel()
                note_reason(send, CLIENT_GONE)
                self.core.cancel(core_id, "client disconnected")
            else:  # the server's grace ran out
                self.core.cancel(core_id, SHUTTING_DOWN)
                await ex.abort(no_replica(SHUTTING_DOWN))
        except Exception as exc:  # a bug must not leave the request hanging in the core
            log.exception("request %s failed in the router", rid)
            self.core.cancel(core_id, f"router error: {type(exc).__name__}")
            await ex.abort(HttpError(500, "internal router error", "server_error"))
        finally:
            ex.done = True
            timer.cancel()
            if ex.watcher is not None:
                ex.watcher.cancel()
            self.router.forget(core_id)
            self.active.discard(task)

    def _check_model(self, model: str) -> None:
        replicas = self.models.replicas_for(model)
        if replicas is None:
            raise model_not_found(model, self.models.names())
        if not any(r.state is ReplicaState.ACTIVE for r in replicas):
            raise no_replica(f"no healthy replica serves `{model}` now")


class Exchange:
    """One request's state through its attempts."""

    __slots__ = (
        "answered",
        "attempt",
        "body",
        "client_gone",
        "done",
        "echo",
        "path",
        "preempted",
        "proxy",
        "send",
        "sse",
        "stalled",
        "started",
        "started_at",
        "task",
        "up_headers",
        "waiting_since",
        "watcher",
    )

    def __init__(
        self,
        proxy: Proxy,
        task: asyncio.Task[None],
        send: Send,
        path: str,
        body: bytes,
        up_headers: dict[str, str],
        echo: list[tuple[bytes, bytes]],
    ) -> None:
        self.proxy = proxy
        self.task = task
        self.send = send
        self.path = path
        self.body = body
        self.up_headers = up_headers
        self.echo = echo
        self.attempt: Assignment | None = None
        self.started = False
        """The response has begun: nothing may be retried any more."""
        self.answered = False
        self.sse = False
        self.preempted = False
        self.client_gone = False
        self.done = False
        self.watcher: asyncio.Task[None] | None = None
        self.stalled: str | None = None
        """Why health checking stopped the running attempt: its replica was found stuck."""
        self.started_at = 0.0
        """When the running attempt was sent to its replica."""
        self.waiting_since = 0.0
        """Since when the attempt waits for its replica's next chunk (inf while writing)."""

    @property
    def streaming(self) -> bool:
        """The stream has relayed a chunk (for the silence watch)."""
        return self.started

    # ---- signals from outside the handler --------------------------------------------------

    def on_attempt_cancelled(self, a: Assignment) -> None:
        """The core cancelled an attempt (preemption): stop it where it is."""
        if self.attempt is a:
            self.preempted = True
            self.task.cancel()

    def interrupt(self, reason: str) -> None:
        """Health checking found the attempt's replica stuck (silent, and a generation probe
        failed): stop the attempt where it is; ``_attempt`` fails it with ``reason``."""
        if self.attempt is not None and self.stalled is None and not self.done:
            self.stalled = reason
            self.task.cancel()

    def start_watching(self, receive: Receive) -> None:
        """The request has run a while: from now on, a disconnect cancels the handler."""
        if not self.done:
            self.watcher = self.task.get_loop().create_task(self.watch(receive))

    async def watch(self, receive: Receive) -> None:
        """Wait for the client to go away; then cancel the handler."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.done:
            self.client_gone = True
            self.task.cancel()

    # ---- the loop --------------------------------------------------------------------------

    async def run(self, ticket: Ticket) -> None:
        running = self.proxy.core.running
        while True:
            event = ticket.next_nowait() or await ticket.next()
            if isinstance(event, Finished):
                await self._end(event)
                return
            if running.get(event.request.id) is event:  # else preempted before it began
                await self._attempt(event)

    async def _attempt(self, a: Assignment) -> None:
        proxy = self.proxy
        self.attempt = a
        try:
            failure = await self._exchange(a)
            if failure is not None:
                reason, blame = failure
                if blame:
                    proxy.health.failure(a.replica, reason)
                retry = blame and not self.started
                if retry and a.request.attempts < proxy.core.settings.retries.attempts:
                    await asyncio.sleep(proxy.backoff_s(a.request.attempts))
                proxy.core.fail(a, reason, retryable=retry)
        except asyncio.CancelledError:
            if self.stalled is not None:
                reason, self.stalled = self.stalled, None
                if self.task.uncancel() == 0 and not self.client_gone:
                    # Not counted against the replica again: the probe that stopped it has
                    # ejected it already. Retried elsewhere if nothing reached the client yet.
                    proxy.core.fail(a, reason, retryable=not self.started)
                    return
            if self.preempted:
                self.preempted = False
                if self.task.uncancel() == 0 and not self.client_gone:
                    return  # the core re-queued or failed the request: the ticket says which
            raise
        finally:
            self.attempt = None

    async def _exchange(self, a: Assignment) -> Failure | None:
        proxy = self.proxy
        r = a.replica
        url = proxy.bases[r.index] + self.path
        silence = proxy.health.silence
        self.started_at = self.waiting_since = proxy.core.clock()
        silence.begin(r.index, self)
        try:
            async with proxy.upstream.post(url, self.body, self.up_headers) as response:
                status = response.status
                if status >= 500:
                    return f"{r.id} answered {status}", True
                content_type = response.headers.get("Content-Type", "application/json")
                if status < 300 and content_type.startswith("text/event-stream"):
                    return await self._relay(a, response, content_type)
                data = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{r.id}: {failure_reason(exc)}", True
        finally:
            silence.end(r.index, self)
        if status < 300:  # it generated (a frozen vLLM still refuses bad requests at once)
            silence.heard_from(r.index, proxy.core.clock())
        await self._answer(a, status, content_type, data)
        proxy.health.success(r)
        if status >= 300:  # the replica refused the request itself: not its fault, not retried
            proxy.core.fail(a, f"{r.id} answered {status}", retryable=False)
        else:
            proxy.core.complete(a)
        return None

    def _head(self, a: Assignment, status: int, content_type: str) -> dict[str, object]:
        headers = [
            (b"content-type", content_type.encode("latin-1")),
            (REPLICA_HEADER, a.replica.id.encode()),
            *self.echo,
        ]
        return {"type": "http.response.start", "status": status, "headers": headers}

    def _first_byte(self, a: Assignment, first_token: bool) -> None:
        self.started = True
        self.proxy.core.first_byte(a, first_token=first_token)
        self.proxy.metrics.first_byte(a)

    async def _answer(self, a: Assignment, status: int, content_type: str, data: bytes) -> None:
        head = self._head(a, status, content_type)
        head["headers"].append((b"content-length", b"%d" % len(data)))  # type: ignore[attr-defined]
        self._first_byte(a, first_token=False)  # the whole answer: no time to first token
        await self.send(head)
        await self.send({"type": "http.response.body", "body": data, "more_body": False})
        self.answered = True

    async def _relay(
        self, a: Assignment, response: aiohttp.ClientResponse, content_type: str
    ) -> Failure | None:
        send = self.send
        clock = self.proxy.core.clock
        silence = self.proxy.health.silence
        i = a.replica.index
        events = 0
        done = False
        # vLLM ends a stream whose engine died with an error event, then ``data: [DONE]``:
        # reaching [DONE] alone is not a success.
        errored: str | None = None
        previous = b""
        try:
            async for chunk in response.content.iter_any():
                now = clock()
                silence.chunk(i, now, now - self.waiting_since if self.started else None)
                self.waiting_since = _WRITING
                if not self.started:
                    self.sse = True
                    self._first_byte(a, first_token=True)
                    await send(self._head(a, response.status, content_type))
                events += chunk.count(b"data:")
                a.streamed = events
                errored = errored or _error_event(a, previous, chunk)
                if not done and _ends_with_done(previous, chunk):
                    done = self.answered = True  # no error event may follow it now
                    silence.end(i, self)  # the answer is whole: nothing left to watch
                    try:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    finally:  # even if the client hung up meanwhile: it had the answer
                        self._settle(a, events, errored)
                    continue  # read the replica's end, so its connection can be reused
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.waiting_since = clock()
                previous = chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not done:
                return f"{a.replica.id}: {failure_reason(exc)}", True
        if not self.started:
            self.sse = True
            self._first_byte(a, first_token=False)  # a stream that ended before any chunk
            await send(self._head(a, response.status, content_type))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.answered = True
        if not done:  # a stream that ended without [DONE] (not every server sends one)
            self._settle(a, events + 1, errored)
        return None

    def _settle(self, a: Assignment, events: int, errored: str | None) -> None:
        """End the request as its stream said: completed, or failed by the replica's own
        error event (relayed to the client as it was; too late to re-run elsewhere)."""
        if errored is not None:
            note_reason(self.send, "upstream_error")  # a 200 whose stream ended in an error
            self.proxy.health.failure(a.replica, errored)
            self.proxy.core.fail(a, errored, retryable=False)
            return
        self.proxy.health.success(a.replica)
        # One event per token, less the closing [DONE]: close enough for tokens per second.
        self.proxy.core.complete(a, max(events - 1, 0))

    # ---- endings ---------------------------------------------------------------------------

    async def _end(self, finished: Finished) -> None:
        if finished.outcome is Outcome.COMPLETED or self.answered:
            return
        await self.abort(_http_error(finished))

    async def abort(self, error: HttpError) -> None:
        """Tell the client the request failed, however far its answer got."""
        if self.answered:
            return
        self.answered = True
        if not self.started:
            await send_error(self.send, error, self.echo)
            return
        note_reason(self.send, error.code or error.type)  # the 200 under way ended in this
        if self.sse:
            event = {"error": {"message": error.message, "type": error.type, "code": error.code}}
            chunk = b"data: " + orjson.dumps(event) + b"\n\n"
            await self.send({"type": "http.response.body", "body": chunk, "more_body": True})
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})


_WRITING = float("inf")
"""``waiting_since`` while the relay writes to its client: not waiting on the replica."""
_DONE = b"data: [DONE]"


_ERROR_EVENT = b'data: {"error"'


def _error_event(a: Assignment, previous: bytes, chunk: bytes) -> str | None:
    """The failure reason if ``chunk`` (after the end of ``previous``) holds an error event
    (``data: {"error": {...}}``, as vLLM, SGLang and TGI write one mid-stream)."""
    seen = previous[-len(_ERROR_EVENT) :] + chunk
    at = seen.find(_ERROR_EVENT)
    if at < 0:
        return None
    line = seen[at + len(b"data: ") :].split(b"\n", 1)[0]
    try:
        error = orjson.loads(line)["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = None  # the event is cut between reads: its start is enough to know
    return f"{a.replica.id} ended its stream with an error: {message or 'no message'}"


def _ends_with_done(previous: bytes, chunk: bytes) -> bool:
    """Whether the stream so far (``previous`` chunk, then ``chunk``) ends with the closing
    ``data: [DONE]`` event; looks at the last bytes only, across a split between reads."""
    tail = chunk[-16:] if len(chunk) >= 16 else previous[-16:] + chunk
    return tail.rstrip(b"\r\n").endswith(_DONE)


def _http_error(finished: Finished) -> HttpError:
    match finished.outcome:
        case Outcome.REJECTED if finished.retry_after_s is not None:
            return queue_full(finished.retry_after_s)
        case Outcome.REJECTED:
            return HttpError(400, finished.reason, code="context_length_exceeded")
        case Outcome.EXPIRED:
            return deadline_passed()
        case _ if finished.reason == SHUTTING_DOWN:
            return no_replica(SHUTTING_DOWN)
        case _:
            return upstream_failed(finished.reason)
