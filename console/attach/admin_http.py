"""The admin API of a router elsewhere, asked without blocking the console's loop.

The same routes, errors and messages as ``gpurouter ctl``'s client (``console/ctl/client.py``,
whose checks it reuses), over an ``httpx.AsyncClient``: every failure is a
:class:`~console.ctl.errors.CtlError` carrying its exit code; no httpx exception leaves here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from console.attach.events import Opened
from console.ctl.client import (
    TOKEN_ENV,
    check_response,
    event_line,
    header_value,
    json_object,
    normalize_url,
    translated,
)
from console.ctl.errors import AuthFailedError, BadValueError
from router.http.admin import RUN_HEADER

__all__ = ["AsyncAdmin"]

REFUSED = 409
NOT_SERVED = 404
"""The router read the command and refused it: the answer is still its audit event."""


class AsyncAdmin:
    """One router's admin API: GET a route's JSON object, POST a command, follow the trail."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        actor: str,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = normalize_url(base_url)
        self.timeout_s = timeout_s
        headers = {"Accept": "application/json", "X-Actor": header_value("actor", actor)}
        if token:
            headers["Authorization"] = f"Bearer {header_value('token', token)}"
        try:
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise BadValueError(f"bad admin URL {self.base_url!r}: {exc}") from None

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get(self, path: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        with translated(self.base_url, self.timeout_s):
            response = await self._http.get(path, params=params)
        self._check(response)
        return json_object(response, path)

    async def get_if_served(self, path: str) -> dict[str, Any] | None:
        """GET ``path``; None when the router does not serve it (404: a router without
        rollouts, such as a service of several workers)."""
        with translated(self.base_url, self.timeout_s):
            response = await self._http.get(path)
        if response.status_code == NOT_SERVED:
            return None
        self._check(response)
        return json_object(response, path)

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a JSON object; a refusal (409) is a RefusedError with the router's reason."""
        with translated(self.base_url, self.timeout_s):
            response = await self._http.post(path, json=dict(body))
        self._check(response)
        return json_object(response, path)

    async def command(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The audit event the router answered, applied (200) or refused (409)."""
        path = "/admin/commands"
        with translated(self.base_url, self.timeout_s):
            response = await self._http.post(path, json=dict(body))
        if response.status_code != REFUSED:
            self._check(response)
        return json_object(response, path)

    async def follow(
        self, since: int, run: str | None = None
    ) -> AsyncIterator[Opened | dict[str, Any]]:
        """The run the router numbers its events in (:class:`Opened`, first), its audit trail
        after ``since`` (counted in ``run``: all of it if the router is in another run), then
        each event as it happens, until the router ends the stream or the connection is lost
        (an :class:`UnreachableError`)."""
        params: dict[str, str | int] = {"since": since, "follow": 1, "format": "jsonl"}
        if run is not None:
            params["run"] = run
        # Events can be minutes apart: only connecting is bounded.
        timeout = httpx.Timeout(self.timeout_s, read=None)
        with translated(self.base_url, self.timeout_s):
            async with self._http.stream(
                "GET", "/admin/events", params=params, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    self._check(response)
                yield Opened(response.headers.get(RUN_HEADER.decode()))
                async for line in response.aiter_lines():
                    if line.strip():
                        yield event_line(line)

    def _check(self, response: httpx.Response) -> None:
        # ctl's message names its --token option; the console reads only the environment.
        if response.status_code == 401:
            raise AuthFailedError(f"{self.base_url} needs a token: set {TOKEN_ENV}")
        check_response(response, self.base_url)
