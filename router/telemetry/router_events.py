"""A router's audit trail on the ``events`` topic, written and read here.

Each router with a control link publishes every event of its audit trail (QoS 1) as the
event's JSON with the router's id and the schema version: :func:`encode_event` writes it,
:func:`decode_event` reads it back for whoever watches the cluster and refuses, with a
:class:`~router.telemetry.schema.PayloadError`, anything that is not one.
"""

from __future__ import annotations

import json
import math
from typing import Any

from router.control import Event
from router.telemetry.control_messages import CONTROL_VERSION
from router.telemetry.schema import PayloadError

__all__ = ["MAX_EVENT_BYTES", "decode_event", "encode_event"]

MAX_EVENT_BYTES = 16 * 1024


def encode_event(router: str, event: Event) -> bytes:
    body = {"v": CONTROL_VERSION, "router": router, **event.to_dict()}
    return json.dumps(body, default=str).encode()


def decode_event(payload: object) -> tuple[str, Event]:
    """The router that published it and the event; PayloadError says what is wrong."""
    if not isinstance(payload, bytes | bytearray):
        raise PayloadError(f"payload: expected bytes, got {type(payload).__name__}")
    if len(payload) > MAX_EVENT_BYTES:
        raise PayloadError(f"payload: {len(payload)} bytes, over {MAX_EVENT_BYTES}")
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"payload: not JSON: {str(exc)[:120]}") from None
    if not isinstance(body, dict) or body.get("v") != CONTROL_VERSION:
        raise PayloadError(f"payload: not a version {CONTROL_VERSION} object")
    router, seq, at = body.get("router"), body.get("seq"), body.get("at")
    if not isinstance(router, str) or not router or type(seq) is not int:
        raise PayloadError("router, seq: expected a name and an integer")
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise PayloadError("at: expected a finite number")
    actor, kind, message = (_text(body, key) for key in ("actor", "kind", "message"))
    args: Any = body.get("args")
    if not isinstance(args, dict) or type(body.get("ok")) is not bool:
        raise PayloadError("args, ok: expected an object and a boolean")
    return router, Event(seq, float(at), actor, kind, args, body["ok"], message)


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise PayloadError(f"{key}: expected a string")
    return value
