"""The front door's connection limits: no single client can stall the router.

uvicorn's httptools protocol has no limit on the size of a request's head and no clock on
a connection until its first response: one client sending header bytes without end made
the parser copy an ever-growing value (a full core, hundreds of MB), and sockets that never
send stayed open until the process ran out of file descriptors. ``GuardedProtocol`` keeps
uvicorn's protocol and adds, per connection:

- a cap on the request line (414) and on the head's bytes and header count (431);
- a clock on the head: a request whose head is not complete ``header_timeout_s`` after its
  first byte (or after the connection opened) gets 408, or is closed if it sent nothing;
- a clock between body chunks (``body_timeout_s``; 408 when nothing was answered yet);
- a cap on open connections: at the cap, a new connection takes the place of the
  connection that has waited longest without a request being served on it, and is refused
  with 503 when every connection is serving one;
- a lingering close: a refusal sent while the client is still sending its body (a 413)
  half-closes and reads the rest away for a while, so the client reads the answer instead
  of a reset connection.

Every refusal is an OpenAI-style JSON error (errors.py). A limit of 0 turns that check off.
"""

from __future__ import annotations

import asyncio
import math
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from router.config.schema import ServerConfig
from router.http.errors import HttpError

__all__ = ["ConnectionLimits", "GuardedProtocol", "guarded_protocol"]

LINGER_S = 5.0
"""How long a lingering close keeps reading what a refused client still sends."""
LINGER_BYTES = 256 * 1024 * 1024
"""The most a lingering close reads away before it closes regardless: a body the client
was told is too large. A refused head gets only ``max_header_bytes`` more: a client that
sends more than another head's worth is not reading answers."""
_FD_RESERVE = 64
"""File descriptors kept back from client connections: listeners, the broker, logs, probes."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The ``server.*`` limits one listener enforces (0: no limit)."""

    max_connections: int
    max_request_line_bytes: int
    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_timeout_s: float

    @classmethod
    def from_config(cls, server: ServerConfig, upstream_connections: int) -> ConnectionLimits:
        return cls(
            max_connections=_connection_budget(server.max_connections, upstream_connections),
            max_request_line_bytes=server.max_request_line_bytes,
            max_header_bytes=server.max_header_bytes,
            max_headers=server.max_headers,
            header_timeout_s=server.header_timeout_s,
            body_timeout_s=server.body_timeout_s,
        )


def _connection_budget(configured: int, upstream_connections: int) -> int:
    """``configured``, lowered to what the process's open-file limit leaves after the
    upstream pool: past it, accept() fails and every new client waits in the backlog."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    # The pool seldom opens every connection it may; half the files stay for clients.
    upstream = min(upstream_connections, soft // 2)
    room = max(16, soft - upstream - _FD_RESERVE)
    return min(configured, room) if configured else room


class _RefusedError(Exception):
    """Raised inside a parser callback to stop the request there."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error.message)
        self.error = error


Refused = Callable[[int, str], None]
"""Told of each answer the limits give: its status and reason (for /metrics)."""


def guarded_protocol(limits: ConnectionLimits, refused: Refused) -> type[GuardedProtocol]:
    """The protocol class for one listener (uvicorn's ``http=`` takes a class)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits, "refused": refused})


def _not_counted(status: int, reason: str) -> None:
    pass


class GuardedProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits]
    refused: ClassVar[Refused] = staticmethod(_not_counted)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._waiting_since = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._lingering = -1  # bytes read away since a lingering close began; -1: not lingering
        self._linger_cap = LINGER_BYTES

    # ---- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cap = self.limits.max_connections
        if cap and len(self.connections) >= cap and not self._evict_one():
            super().connection_made(transport)
            self._refuse(_TOO_MANY)
            return
        super().connection_made(transport)
        self._no_delay(transport)
        self._arm_head_timer()

    @staticmethod
    def _no_delay(transport: asyncio.Transport) -> None:
        # uvicorn writes a response's head and body apart; with Nagle's algorithm on (plain
        # asyncio sets no TCP_NODELAY on accepted sockets) the body waits for the client's
        # delayed ACK: 40 ms on every answer.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest with no request being served."""
        waiting = [c for c in self.connections if isinstance(c, GuardedProtocol) and c._idle()]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c._waiting_since)
        oldest.transport.close()
        self.connections.discard(oldest)
        return True

    def _idle(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    # ---- the request's head --------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering >= 0:
            self._linger_on(len(data))
            return
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            refused = exc.__context__
            if isinstance(refused, _RefusedError):
                self._refuse(refused.error)
            else:
                self._refuse(HttpError(400, "malformed HTTP request", code="invalid_request"))
            return
        limit = self.limits.max_header_bytes
        if self._in_head and limit and self._head_bytes > limit:
            self._refuse(_head_too_large(limit))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_count = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        limit = self.limits.max_request_line_bytes
        if limit and len(self.url) > limit:
            message = f"the request target is longer than {limit} bytes"
            raise _RefusedError(HttpError(414, message, code="too_large"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        limit = self.limits.max_headers
        if limit and self._header_count > limit:
            raise _RefusedError(
                HttpError(431, f"the request has more than {limit} header fields", code="too_large")
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        limit = self.limits.max_header_bytes
        if limit and self._parsed_head_bytes() > limit:
            # The head's last bytes came in the same read as its end.
            raise _RefusedError(_head_too_large(limit))
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()
        if self.cycle is not None:
            # The cycle closes the connection after a "connection: close" answer; one sent
            # before the body was read (a 413) must linger instead.
            self.cycle.transport = _LingerOnClose(self)  # type: ignore[assignment]
        self._arm_body_timer()

    def _parsed_head_bytes(self) -> int:
        # The bytes of the head as parsed (a read may carry the body's start too).
        return len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm_body_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._cancel_body_timer()
        # What comes next on this connection is the next request's head: count it from its
        # first read (on_message_begin fires only inside that read's parse).
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        self._waiting_since = time.monotonic()
        super().on_response_complete()

    # ---- clocks --------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        self._waiting_since = time.monotonic()
        if self.limits.header_timeout_s:
            self._head_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._head_timed_out
            )

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self._head_bytes == 0 and self._idle():
            self.transport.close()  # it never began a request: nothing to answer
            return
        timeout = self.limits.header_timeout_s
        self._refuse(_timeout(f"the request head took longer than {timeout:g} s"))

    def _arm_body_timer(self) -> None:
        self._cancel_body_timer()
        if self.limits.body_timeout_s and self.cycle is not None and self.cycle.more_body:
            self._body_timer = self.loop.call_later(
                self.limits.body_timeout_s, self._body_timed_out
            )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.transport.is_closing():
            return
        if self.flow.read_paused:
            self._arm_body_timer()  # the app has not read what came: not the client's delay
            return
        timeout = self.limits.body_timeout_s
        self.abandon(_timeout(f"no part of the request body came for {timeout:g} s"))

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()

    # ---- refusals ------------------------------------------------------------------------

    def abandon(self, error: HttpError) -> None:
        """At shutdown, once the grace is over: a request not yet answered gets ``error``
        (not uvicorn's plain-text 500 when its task is cancelled); an answer under way is
        cut. Either way the app's ``receive()`` reads a disconnect and unwinds."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
            return
        if cycle.response_started:
            self.transport.close()
        else:
            self._refuse(error)
        cycle.disconnected = True
        cycle.message_event.set()

    def _refuse(self, error: HttpError) -> None:
        """Answer ``error`` outside any ASGI cycle and close, lingering if the client may
        still be sending."""
        self._cancel_timers()
        if self.transport.is_closing():
            return
        type(self).refused(error.status, error.code or error.type)
        body = error.body()
        head = [
            b"HTTP/1.1 %d %s\r\n" % (error.status, _REASONS.get(error.status, b"Error")),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
        ]
        if error.retry_after_s is not None:
            head.append(b"retry-after: %d\r\n" % max(1, math.ceil(error.retry_after_s)))
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.close_lingering(self.limits.max_header_bytes if self._in_head else LINGER_BYTES)

    def close_lingering(self, max_bytes: int = LINGER_BYTES) -> None:
        """Stop writing, read away what the client still sends for ``LINGER_S``, then close.
        Closing with unread bytes would reset the connection and lose the answer."""
        if self.transport.is_closing():
            return
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = 0
        self._linger_cap = max_bytes
        self.flow.resume_reading()
        self.loop.call_later(LINGER_S, self.transport.close)

    def _linger_on(self, size: int) -> None:
        self._lingering += size
        if self._lingering > self._linger_cap:
            self.transport.close()


class _LingerOnClose:
    """The connection's transport as one request's cycle sees it: ``close()`` lingers while
    that request's body is still coming."""

    def __init__(self, protocol: GuardedProtocol) -> None:
        self._protocol = protocol
        self._transport = protocol.transport

    def close(self) -> None:
        cycle = self._protocol.cycle
        if cycle is not None and cycle.more_body:
            self._protocol.close_lingering()
        else:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _head_too_large(limit: int) -> HttpError:
    return HttpError(431, f"the request head is larger than {limit} bytes", code="too_large")


def _timeout(message: str) -> HttpError:
    return HttpError(408, message, code="request_timeout")


_TOO_MANY = HttpError(
    503,
    "the router has too many open connections",
    "server_error",
    code="too_many_connections",
    retry_after_s=1,
)

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    413: b"Content Too Large",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
