"""A small synchronous client of the router's admin API (see ``router/http/admin.py``).

One request per ``ctl`` invocation is not a hot path, so plain blocking httpx serves. Every
failure becomes a :class:`~console.ctl.errors.CtlError` carrying its exit code; no httpx
exception leaves this module.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Iterator, Mapping
from typing import Any

import httpx

from console.ctl.errors import (
    AuthFailedError,
    BadValueError,
    RefusedError,
    UnreachableError,
)

__all__ = [
    "TOKEN_ENV",
    "AdminClient",
    "actor_name",
    "check_response",
    "event_line",
    "header_value",
    "json_object",
    "normalize_url",
    "token_from_environment",
    "translated",
]

TOKEN_ENV = "GPUROUTER_ADMIN_TOKEN"
"""Where ``ctl`` and the attached console read the admin API's bearer token."""


def token_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """The admin token in :data:`TOKEN_ENV`; None when it is unset or empty."""
    return environ.get(TOKEN_ENV) or None


def actor_name(role: str, environ: Mapping[str, str] = os.environ) -> str:
    """Who acts, for the audit trail: ``ROLE:$USER``, or ``ROLE`` when no user is known."""
    user = environ.get("USER") or environ.get("USERNAME")
    return f"{role}:{user}" if user else role


def normalize_url(url: str) -> str:
    """``127.0.0.1:8001`` -> ``http://127.0.0.1:8001``; a trailing slash is dropped."""
    url = url.strip()
    if not url:
        raise BadValueError("the admin URL is empty")
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


class AdminClient:
    """The admin API of one router: state, commands, the audit trail, routing decisions."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        actor: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_url(base_url)
        self.timeout_s = timeout_s
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {header_value('token', token)}"
        if actor:
            headers["X-Actor"] = header_value("actor", actor)
        try:
            self._http = httpx.Client(
                base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise BadValueError(f"bad admin URL {self.base_url!r}: {exc}") from None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ---- the routes ---------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The fleet snapshot with health and (when known) telemetry."""
        return json_object(self._send("GET", "/admin/state"), "/admin/state")

    def command(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Apply one command; the audit event when applied, :class:`RefusedError` when not."""
        return json_object(
            self._send("POST", "/admin/commands", json=dict(body)), "/admin/commands"
        )

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """The audit trail after sequence number ``since``."""
        data = json_object(
            self._send("GET", "/admin/events", params={"since": since}), "/admin/events"
        )
        return _list(data, "events")

    def decisions(self, limit: int) -> list[dict[str, Any]]:
        """The ``limit`` most recent routing decisions, oldest first."""
        response = self._send("GET", "/admin/decisions", params={"limit": limit})
        return _list(json_object(response, "/admin/decisions"), "decisions")

    def rollout(self) -> dict[str, Any] | None:
        """The current (or last) rollout's state; None before the first."""
        data = json_object(self._send("GET", "/admin/rollout"), "/admin/rollout")
        return _rollout_of(data)

    def rollout_action(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start or steer a rollout; its state afterwards (:class:`RefusedError` when
        refused)."""
        response = self._send("POST", "/admin/rollout", json=dict(body))
        rollout = _rollout_of(json_object(response, "/admin/rollout"))
        if rollout is None:
            raise UnreachableError("/admin/rollout answered no rollout after an action")
        return rollout

    def rollout_preview(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A rollout's plan and predicted cost, nothing started (:class:`RefusedError` when a
        start would be refused)."""
        response = self._send("POST", "/admin/rollout", json={**body, "action": "preview"})
        preview = json_object(response, "/admin/rollout").get("preview")
        if not isinstance(preview, dict):
            raise UnreachableError("/admin/rollout answered no preview; is the router older?")
        return preview

    def split(self) -> dict[str, Any] | None:
        """The canary's or blue-green set's traffic split; None when there is none."""
        return _split_of(json_object(self._send("GET", "/admin/split"), "/admin/split"))

    def split_action(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Start or steer a canary or blue-green switch; the split's state afterwards
        (:class:`RefusedError` when refused)."""
        response = self._send("POST", "/admin/split", json=dict(body))
        split = _split_of(json_object(response, "/admin/split"))
        if split is None:
            raise UnreachableError("/admin/split answered no split after an action")
        return split

    def follow(self, since: int = 0) -> Generator[dict[str, Any], None, None]:
        """The audit trail after ``since``, then each new event as it happens.

        Runs until the caller stops iterating (and closes the generator) or the router ends
        the stream, which raises :class:`UnreachableError`: the router has gone away.
        """
        params: dict[str, str | int] = {"since": since, "follow": 1, "format": "jsonl"}
        # Events can be minutes apart: only connecting is bounded.
        timeout = httpx.Timeout(self.timeout_s, read=None)
        with self._call():
            stream = self._http.stream("GET", "/admin/events", params=params, timeout=timeout)
            with stream as response:
                if response.status_code != 200:
                    response.read()
                    check_response(response, self.base_url)
                for line in response.iter_lines():
                    if line.strip():
                        yield event_line(line)
        raise UnreachableError("the router closed the event stream (it is stopping)")

    # ---- plumbing -------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self._call():
            response = self._http.request(method, path, **kwargs)
        check_response(response, self.base_url)
        return response

    def _call(self) -> contextlib.AbstractContextManager[None]:
        return translated(self.base_url, self.timeout_s)


@contextlib.contextmanager
def translated(base_url: str, timeout_s: float) -> Iterator[None]:
    """httpx's transport failures, as :class:`UnreachableError` or :class:`BadValueError`."""
    try:
        yield
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise BadValueError(f"bad admin URL {base_url!r}: {exc}") from None
    except httpx.TimeoutException:
        raise UnreachableError(f"{base_url} did not answer within {timeout_s:g}s") from None
    except httpx.ConnectError as exc:
        raise UnreachableError(f"cannot connect to {base_url}: {_reason(exc)}") from None
    except httpx.TransportError as exc:
        raise UnreachableError(f"lost the connection to {base_url}: {_reason(exc)}") from None


def check_response(response: httpx.Response, base_url: str) -> None:
    """Raise the error a non-200 answer means; return for 200."""
    status = response.status_code
    if status == 200:
        return
    if status == 401:
        raise AuthFailedError(
            f"{base_url} needs a token: pass --token or set GPUROUTER_ADMIN_TOKEN"
        )
    if status == 403:
        raise AuthFailedError(f"{base_url} refused the token")
    message = _message(response)
    if status == 409:
        raise RefusedError(f"refused: {message}")
    if status == 400:
        raise BadValueError(f"the router could not read the request: {message}")
    path = response.request.url.path
    raise UnreachableError(
        f"{base_url} answered HTTP {status} to {path}; is it a gpurouter admin API? ({message})"
    )


def _message(response: httpx.Response) -> str:
    """The event's message (409), the OpenAI-style error's message, or the body's start."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        return response.text[:200] or response.reason_phrase
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(data.get("message"), str):
            return str(data["message"])
    return response.text[:200]


def json_object(response: httpx.Response, path: str) -> dict[str, Any]:
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        raise UnreachableError(f"{path} did not answer a JSON object; is it a gpurouter admin API?")
    return data


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key)
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise UnreachableError(f"the admin API's answer has no list of {key}")
    return items


def _rollout_of(data: dict[str, Any]) -> dict[str, Any] | None:
    rollout = data.get("rollout", False)
    if rollout is not None and not isinstance(rollout, dict):
        raise UnreachableError(
            "/admin/rollout did not answer a rollout; is it a gpurouter admin API?"
        )
    return rollout


def _split_of(data: dict[str, Any]) -> dict[str, Any] | None:
    split = data.get("split", False)
    if split is not None and not isinstance(split, dict):
        raise UnreachableError("/admin/split did not answer a split; is it a gpurouter admin API?")
    return split


def event_line(line: str) -> dict[str, Any]:
    """One JSON line of the followed event stream; UnreachableError for anything else."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        raise UnreachableError(f"unreadable line in the event stream: {line[:80]!r}")
    return event


def header_value(what: str, value: str) -> str:
    # httpx sends headers as ASCII; say which option is wrong instead of a UnicodeEncodeError.
    if not value.isascii() or not value.isprintable():
        raise BadValueError(f"the {what} must be printable ASCII")
    return value


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.rsplit("] ", 1)[-1]  # "[Errno 111] Connection refused" -> "Connection refused"
