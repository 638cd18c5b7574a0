"""The HTTP face of one emulated replica: vLLM's OpenAI-compatible routes.

``POST /v1/completions`` and ``/v1/chat/completions`` (streamed or not), ``GET /v1/models``,
``/health`` and ``/metrics``. A request flows: body parsed (openai_request) -> lengths planned
against the replica's limits (replica.plan) -> sequence submitted to the engine driver ->
tokens written as the engine produces them, or the whole body once it finishes. Whatever ends
the handler (the end, a write to a closed socket, the client going away) releases the
sequence, which cancels it in the engine if it had not finished.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from router.emulator.driver import Generation
from router.emulator.metrics import CONTENT_TYPE, FinishedRequest
from router.emulator.openai_format import (
    ResponseHeader,
    StreamChunks,
    completion_body,
    models_body,
    version_body,
)
from router.emulator.openai_request import ApiError, CompletionRequest, Kind, parse_request

if TYPE_CHECKING:
    from router.emulator.replica import EmulatedReplica, Job

__all__ = ["build_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_MAX_BODY_BYTES = 64 * 2**20


def build_app(replica: EmulatedReplica) -> web.Application:
    """The aiohttp application of ``replica``."""
    app = web.Application(client_max_size=_MAX_BODY_BYTES, middlewares=[_json_route_errors])
    created = int(time.time())

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _complete(replica, request, "completion")

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _complete(replica, request, "chat")

    async def models(_: web.Request) -> web.StreamResponse:
        return web.json_response(
            models_body(replica.model, replica.max_model_len, created, replica.aliases)
        )

    async def health(_: web.Request) -> web.StreamResponse:
        return web.Response()

    async def version(_: web.Request) -> web.StreamResponse:
        return web.json_response(version_body())

    async def metrics(_: web.Request) -> web.StreamResponse:
        body = replica.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app.router.add_post("/v1/completions", _hangable(replica, completions))
    app.router.add_post("/v1/chat/completions", _hangable(replica, chat))
    routes = (
        ("/v1/models", models),
        ("/health", health),
        ("/version", version),
        ("/metrics", metrics),
    )
    for path, handler in routes:
        app.router.add_get(path, _hangable(replica, handler))
    return app


@web.middleware
async def _json_route_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unknown path (404) or method (405) in JSON, ``{"detail": ...}``, as vLLM's app."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status not in (404, 405):
            raise
        allow = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return web.json_response({"detail": exc.reason}, status=exc.status, headers=allow)


def _hangable(replica: EmulatedReplica, handler: Handler) -> Handler:
    async def answer(request: web.Request) -> web.StreamResponse:
        # A hung replica reads the request and then says nothing until healed (or until the
        # client gives up, which cancels this handler).
        await request.read()
        await replica.answering.wait()
        return await handler(request)

    return answer


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


async def _complete(
    replica: EmulatedReplica, request: web.Request, kind: Kind
) -> web.StreamResponse:
    try:
        req = parse_request(kind, await request.read())
        job = replica.plan(req)
        if replica.draws_failure():
            raise ApiError(500, "emulated failure (fault injection)")
    except ApiError as exc:
        return _error(exc)
    gen = replica.driver.submit(job.prompt_tokens, job.output_tokens)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    model = req.model or replica.model
    head = ResponseHeader(kind, f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)
    try:
        if req.stream:
            return await _stream(request, replica, req, job, gen, head)
        await replica.driver.wait_done(gen)
        await replica.answering.wait()
        body = completion_body(head, job.output_tokens, job.finish_reason, job.prompt_tokens)
        return web.json_response(body)
    finally:
        _report_end(replica, gen, job, req.max_tokens)
        replica.driver.release(gen)


def _report_end(
    replica: EmulatedReplica, gen: Generation, job: Job, max_tokens: int | None
) -> None:
    """A request the engine finished, to the metrics (an unfinished one is an abort, which
    the driver reports when it is released)."""
    first, finished = gen.first_token_at, gen.finished_at
    if first is None or finished is None:
        return
    done = FinishedRequest(
        arrived_at=gen.arrived_at,
        scheduled_at=gen.arrived_at if gen.scheduled_at is None else gen.scheduled_at,
        first_token_at=first,
        finished_at=finished,
        prompt_tokens=job.prompt_tokens,
        output_tokens=job.output_tokens,
        finish_reason=job.finish_reason,
        max_tokens=max_tokens,
        preemptions=gen.seq.preemptions,
    )
    replica.metrics.on_request_end(done)


async def _stream(
    request: web.Request,
    replica: EmulatedReplica,
    req: CompletionRequest,
    job: Job,
    gen: Generation,
    head: ResponseHeader,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    chunks = StreamChunks(head, req.include_usage)
    last = job.output_tokens - 1
    sent = 0
    try:
        while sent < job.output_tokens:
            n = await replica.driver.wait_progress(gen, sent)
            await replica.answering.wait()  # a replica hung mid-stream sends nothing more
            events = [
                chunks.token(i, job.finish_reason if i == last else None) for i in range(sent, n)
            ]
            await response.write(b"".join(events))
            sent = n
        await response.write(chunks.end(job.prompt_tokens, job.output_tokens))
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the caller releases the sequence
    return response
