"""Every answer of the front door and the admin API, counted by route, status and reason.

Refusals that never reach the core (a body that is not JSON, an unknown route, a body over
the limit, a full queue, no replica in service, a bug) were in no counter: the core's
``gpurouter_requests_total`` counts only what it admitted. Each app wraps the ASGI ``send``
in a :class:`~router.http.asgi.CountedSend` and counts once its handler is done:

- ``route``: the route's path, from the app's fixed table, or ``other`` (the front door) or
  ``admin_other`` (the admin API) for any other path, so a scan of made-up paths adds no
  series;
- ``status``: the status sent, or ``none`` when nothing was (the client left first, or the
  server stopped it);
- ``reason``: the error's ``code`` for the router's own refusals (``invalid_request``,
  ``queue_full``, ``forbidden_host``...), ``ok`` below 400, ``upstream`` for an error status
  relayed from a replica as it wrote it, ``command_refused`` for a command the control
  surface refused, ``not_ready`` for ``/ready`` without a replica, ``no_response`` with
  status ``none``. A stream that began (200) and ended with an error event counts its
  error's code.

Every label comes from the router's code or a status number, never from what a client sent.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from router.http.asgi import CountedSend

__all__ = [
    "ADMIN_CONNECTION_ROUTE",
    "CONNECTION_ROUTE",
    "OTHER_ADMIN_ROUTE",
    "OTHER_ROUTE",
    "ResponseCounter",
]

OTHER_ROUTE = "other"
OTHER_ADMIN_ROUTE = "admin_other"
CONNECTION_ROUTE = "connection"
ADMIN_CONNECTION_ROUTE = "admin_connection"
"""The route of an answer the connection limits gave (router/http/guard.py) before any
route was known: a head too large or too slow, the connection cap, the end of a shutdown."""


class ResponseCounter:
    """``gpurouter_http_responses_total{route, status, reason}`` in a router's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._family = Counter(
            "gpurouter_http_responses",
            "Responses of the front door and the admin API, by route, status and reason "
            "(the error's code for the router's own refusals).",
            ["route", "status", "reason"],
            registry=registry,
        )
        # Children by label values: counting is then a dict lookup and an increment.
        self._children: dict[tuple[str, str, str], Counter] = {}

    def count(self, route: str, sent: CountedSend, error_reason: str = "upstream") -> None:
        """Count the response ``sent`` carried; ``error_reason``: the reason of an error
        status that nobody noted (on the front door, one relayed from a replica)."""
        status = sent.status
        if status is None:
            key = (route, "none", sent.reason or "no_response")
        else:
            key = (route, str(status), sent.reason or ("ok" if status < 400 else error_reason))
        self._inc(key)

    def refused(self, route: str, status: int, reason: str) -> None:
        """Count an answer given outside any app (the connection limits)."""
        self._inc((route, str(status), reason))

    def _inc(self, key: tuple[str, str, str]) -> None:
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._family.labels(*key)
        child.inc()
