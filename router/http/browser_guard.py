"""What a web page in the operator's browser could forge against the admin API, refused.

An admin API on loopback without a token trusts whoever can reach it, and a browser on the
same machine can, on behalf of any page it shows:

- **Cross-site request forgery.** A page may POST to ``http://127.0.0.1:8001`` with a
  "simple" content type (``text/plain``, a form's, or none at all) without asking the
  server first; a JSON content type makes the browser ask (a CORS preflight), which the admin
  API never grants. So a request that changes state must say ``application/json``
  (:func:`unsupported_media`: 415 otherwise).
- **DNS rebinding.** A name the attacker controls (``evil.example``) resolves first to
  their server, then to 127.0.0.1: the page's requests then reach the admin API as
  same-origin, but they still carry ``Host: evil.example`` and the page's ``Origin``. So a
  request that arrived on a loopback address must name a loopback host (``localhost``,
  127.0.0.0/8, ``[::1]``) with the listener's own port, in ``Host`` and in ``Origin`` when it
  sends one (:func:`foreign_host`: 403 otherwise). Clients that are not browsers (``gpurouter
  ctl``, curl, scripts) send exactly that.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

from router.http.asgi import Scope
from router.http.errors import HttpError

__all__ = ["foreign_host", "is_loopback", "unsupported_media"]

JSON_MEDIA = "application/json"


def is_loopback(host: str) -> bool:
    """``localhost``, or an address in 127.0.0.0/8 or ``::1``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def foreign_host(scope: Scope, headers: dict[str, str]) -> HttpError | None:
    """For a request that arrived on a loopback address: the 403 its ``Host`` or ``Origin``
    earns when either names another host or port, else None."""
    local = scope.get("server")
    if not local or not is_loopback(str(local[0])):
        return None  # not on loopback: a listener elsewhere needs a token (RouterServer)
    port = int(local[1])
    here = f"127.0.0.1:{port}, localhost:{port} or [::1]:{port}"
    host = headers.get("host")
    if host is None or not _names_here(_split(f"//{host}"), port):
        return HttpError(
            403,
            f"the Host header {host!r} does not name this admin API ({here}); a web page "
            "that re-pointed its own name at this machine sends that (DNS rebinding)",
            "permission_error",
            code="forbidden_host",
        )
    origin = headers.get("origin")
    if origin is not None:
        parts = _split(origin)
        if parts is None or parts.scheme != "http" or not _names_here(parts, port):
            return HttpError(
                403,
                f"requests from the web page at {origin!r} are refused: the admin API answers "
                f"pages of its own origin only (http:// and {here})",
                "permission_error",
                code="forbidden_origin",
            )
    return None


def unsupported_media(headers: dict[str, str]) -> HttpError | None:
    """The 415 a state-changing request earns when its body is not declared JSON."""
    declared = headers.get("content-type")
    if declared is not None and declared.split(";", 1)[0].strip().lower() == JSON_MEDIA:
        return None
    return HttpError(
        415,
        f"Content-Type must be {JSON_MEDIA}, not {declared!r}: a web page can send any "
        "other type to this machine without asking first (cross-site request forgery)",
        code="unsupported_media_type",
    )


def _split(text: str) -> SplitResult | None:
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError when it is not a number in 0..65535
    except ValueError:
        return None
    return parts


def _names_here(parts: SplitResult | None, port: int) -> bool:
    """Whether ``parts`` is exactly a loopback host with ``port`` (80 when not given)."""
    if parts is None or parts.hostname is None or parts.username is not None:
        return False
    if parts.path or parts.query or parts.fragment:
        return False
    return is_loopback(parts.hostname) and (parts.port or 80) == port
