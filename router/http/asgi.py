"""Raw ASGI helpers shared by the front door and the admin API (no framework on the hot path)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from router.http.errors import HttpError, too_large

__all__ = [
    "CountedSend",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "header_map",
    "note_reason",
    "read_body",
    "send_bytes",
    "send_error",
    "send_json",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"


class ClientGoneError(Exception):
    """The client disconnected before its request was read."""


class CountedSend:
    """An ASGI ``send`` that remembers the response's status and why it was given, so that
    the app can count every answer (/metrics) wherever in the app it was sent."""

    __slots__ = ("reason", "send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status: int | None = None
        """The status sent, or None while nothing was."""
        self.reason: str | None = None
        """Why: the error's code (send_error), or what a handler noted (note_reason)."""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


def note_reason(send: Send, reason: str) -> None:
    """Say why this response is what it is, when ``send`` counts responses."""
    if isinstance(send, CountedSend):
        send.reason = reason


def header_map(scope: Scope, wanted: frozenset[bytes] | None = None) -> dict[str, str]:
    """The request's headers by lower-case name (ASGI servers lower-case them already);
    only the ``wanted`` ones when given (the hot path decodes no more than it reads)."""
    return {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in scope["headers"]
        if wanted is None or k in wanted
    }


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The whole request body; HttpError 413 past ``limit`` bytes, ClientGoneError on disconnect."""
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    message = await receive()
    if message["type"] != "http.request":
        raise ClientGoneError
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGoneError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            await _discard(receive, message, cap=4 * limit)
            raise too_large(limit)
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _discard(receive: Receive, message: Message, cap: int) -> None:
    """Read and drop the rest of a body (up to ``cap`` bytes), so that the client, still
    sending, reads the refusal instead of a reset connection."""
    size = 0
    while message.get("more_body", False) and size < cap:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGoneError
        size += len(message.get("body", b""))


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes = JSON,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(
    send: Send, status: int, data: object, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send_bytes(send, status, orjson.dumps(data), JSON, extra)


async def send_error(
    send: Send, error: HttpError, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    note_reason(send, error.code or error.type)
    headers = list(extra or ())
    if error.retry_after_s is not None:
        headers.append((b"retry-after", b"%d" % max(1, math.ceil(error.retry_after_s))))
    if error.status == 413:
        # The unread rest of the body would be taken for the next request: close instead.
        headers.append((b"connection", b"close"))
    await send_bytes(send, error.status, error.body(), JSON, headers)
