"""Signed control messages: an HMAC-SHA256 over the topic and the canonical message.

Routers and the operators' publishers share a secret (``control.secret_env`` names the
environment variable that holds it, else ``GPUROUTER_CONTROL_SECRET``). A publisher adds
``"sig": "sha256=<hex>"`` to each desired-state message; a router with a secret drops and
counts every message whose ``sig`` is missing or wrong before it takes a place in the
control link's queue.

The MAC covers ``<topic> "\\n" <canonical>``, where ``<canonical>`` is the message without
``sig`` as compact JSON with sorted keys and ASCII escapes (Python's
``json.dumps(m, sort_keys=True, separators=(",", ":"))``). The topic is in it so that a
command signed for one cluster or slot cannot be replayed on another. The router checks the
message it parsed, not the bytes it received, so what is checked is what is applied.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from router.config.schema import ControlConfig
from router.errors import ControlError

__all__ = ["MIN_SECRET_LENGTH", "SECRET_ENV", "check", "resolve_secret", "sign"]

SECRET_ENV = "GPUROUTER_CONTROL_SECRET"
"""The variable read for the secret when ``control.secret_env`` names none."""
MIN_SECRET_LENGTH = 16
"""Shorter secrets are refused: a guessable one would authenticate nothing."""
_PREFIX = "sha256="


def resolve_secret(config: ControlConfig, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The shared secret, or None when none is configured; ControlError when the named
    variable is unset or the secret is too short."""
    env = os.environ if environ is None else environ
    var = config.secret_env or SECRET_ENV
    value = env.get(var)
    if not value:
        if config.secret_env is not None:
            raise ControlError(f"control.secret_env names {var}, which is not set")
        return None
    if len(value) < MIN_SECRET_LENGTH:
        raise ControlError(f"the control secret in {var} is under {MIN_SECRET_LENGTH} characters")
    return value.encode("utf-8")


def sign(message: Mapping[str, Any], topic: str, secret: bytes) -> dict[str, Any]:
    """``message`` with its ``sig`` for ``topic``."""
    body = {k: v for k, v in message.items() if k != "sig"}
    return body | {"sig": _PREFIX + _mac(body, topic, secret)}


def check(message: Mapping[str, Any], topic: str, secret: bytes) -> str | None:
    """None when ``message`` carries a good signature for ``topic``; else the refusal reason,
    ``unsigned`` or ``bad_signature``."""
    sig = message.get("sig")
    if sig is None:
        return "unsigned"
    if not isinstance(sig, str) or not sig.startswith(_PREFIX):
        return "bad_signature"
    body = {k: v for k, v in message.items() if k != "sig"}
    try:
        expected = _mac(body, topic, secret)
    except (TypeError, ValueError):  # a value JSON cannot write back: no MAC could cover it
        return "bad_signature"
    given = sig[len(_PREFIX) :].encode("utf-8", "replace")
    return None if hmac.compare_digest(given, expected.encode("ascii")) else "bad_signature"


def _mac(body: Mapping[str, Any], topic: str, secret: bytes) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    signed = topic.encode("utf-8") + b"\n" + canonical.encode("ascii")
    return hmac.new(secret, signed, hashlib.sha256).hexdigest()
