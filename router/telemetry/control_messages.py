"""Control messages, version 1: desired state in, acknowledgements out, and the verdicts a
router's control link reaches on what it receives (``control_topics`` describes the protocol).

A desired-state message is ``{"v": 1, "version": N, "origin": "...", "ts": ..., "command":
{...}}``, plus ``sig`` when signed (:mod:`~router.telemetry.control_auth`), with ``command``
as :func:`router.control.parse_command` reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from router.control import (
    Command,
    Drain,
    Eject,
    EndSplit,
    Preempt,
    Readmit,
    SetBatchSize,
    SetSplit,
    SetStrategy,
    SetWeight,
    Undrain,
    command_args,
    command_name,
    parse_command,
)
from router.errors import ControlError
from router.telemetry import control_auth
from router.telemetry.topics import check_level

__all__ = [
    "CONTROL_VERSION",
    "MAX_CONTROL_BYTES",
    "REFUSALS",
    "Accepted",
    "Ack",
    "Desired",
    "Refused",
    "Stale",
    "Verdict",
    "decode_ack",
    "decode_desired",
    "desired_from",
    "encode_desired",
    "load_message",
    "slot_of",
    "valid_origin",
]

CONTROL_VERSION = 1
MAX_CONTROL_BYTES = 16 * 1024
_ORIGIN = re.compile(r"^[\w.@:-]{1,64}$")


def valid_origin(origin: str) -> bool:
    """Whether ``origin`` may name a publisher: 1-64 of letters, digits, ``. @ : _ -``."""
    return _ORIGIN.match(origin) is not None


REFUSALS = (
    "oversized",
    "malformed",
    "unsigned",
    "bad_signature",
    "wrong_slot",
    "future_version",
    "too_many_slots",
    "overflow",
)
"""Why a control message was dropped; ``ControlLink.refused`` counts each."""


MAX_ACK_BYTES = 4096


def decode_ack(payload: object) -> Ack | None:
    """An acknowledgement (``control/acks/<router>``) read back: its slot, version, verdict
    and message; None for anything else."""
    if not isinstance(payload, bytes | bytearray) or len(payload) > MAX_ACK_BYTES:
        return None
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    slot, version, ok = body.get("slot"), body.get("version"), body.get("ok")
    if not isinstance(slot, str) or type(version) is not int or type(ok) is not bool:
        return None
    message = body.get("message")
    return Ack(slot, version, ok, message if isinstance(message, str) else "")


def slot_of(command: Command) -> str:
    """The desired-state slot a command sets (see ``control_topics``)."""
    match command:
        case SetStrategy():
            return "strategy"
        case SetWeight(replica):
            return f"weight/{check_level(replica, 'replica id')}"
        case SetBatchSize(replica):
            return f"batch/{check_level(replica, 'replica id')}"
        case Drain(replica) | Undrain(replica) | Preempt(replica):
            return f"service/{check_level(replica, 'replica id')}"
        case Eject(replica) | Readmit(replica):
            return f"eject/{check_level(replica, 'replica id')}"
        case SetSplit() | EndSplit():
            return "split"
    raise ControlError(f"no slot for {command!r}")


def encode_desired(
    command: Command,
    version: int,
    origin: str,
    ts: float,
    *,
    topic: str | None = None,
    secret: bytes | None = None,
) -> bytes:
    """The desired-state message for ``command``; signed for ``topic`` when a secret is given."""
    body = {"command": command_name(command), **command_args(command)}
    message: dict[str, Any] = {"v": CONTROL_VERSION, "version": version, "origin": origin}
    message |= {"ts": ts, "command": body}
    if secret is not None:
        if topic is None:
            raise ValueError("a signed control message needs the topic it is signed for")
        message = control_auth.sign(message, topic, secret)
    return json.dumps(message, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Desired:
    """One decoded desired-state message."""

    version: int
    origin: str
    command: Command


def decode_desired(payload: bytes) -> Desired:
    """Read a desired-state message; ControlError says what is wrong with it."""
    if len(payload) > MAX_CONTROL_BYTES:
        raise ControlError(f"control message of {len(payload)} bytes, over {MAX_CONTROL_BYTES}")
    return desired_from(load_message(payload))


def load_message(payload: bytes) -> dict[str, Any]:
    """The JSON object of a control message; ControlError if it is not one."""
    try:
        data = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ControlError("control message is not JSON") from None
    if not isinstance(data, dict):
        raise ControlError("control message: expected an object")
    return data


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def desired_from(data: Mapping[str, Any]) -> Desired:
    """The command a control message's object carries; ControlError says what is wrong."""
    if data.get("v") != CONTROL_VERSION or data.get("v") is True:
        raise ControlError(f"control message: expected an object with v {CONTROL_VERSION}")
    version, origin, body = data.get("version"), data.get("origin"), data.get("command")
    if type(version) is not int or not 0 <= version < 2**63:
        raise ControlError("control message: version must be a non-negative integer")
    if not isinstance(origin, str) or not _ORIGIN.match(origin):
        raise ControlError("control message: origin must be 1-64 of letters, digits, . @ : _ -")
    if not isinstance(body, dict):
        raise ControlError("control message: command must be an object")
    return Desired(version, origin, parse_command(body))


@dataclass(frozen=True, slots=True)
class Accepted:
    """A message to apply: its slot, its command, and the message (kept in the state file)."""

    slot: str
    desired: Desired
    message: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Refused:
    """A message dropped, for ``reason`` (one of :data:`REFUSALS`)."""

    slot: str
    reason: str
    detail: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class Stale:
    """A message older than the one applied on its slot: ignored, and counted."""

    slot: str
    version: int


Verdict: TypeAlias = Accepted | Refused | Stale | None
"""What a control message comes to; None: not a command for this link, an empty retained
message (a slot being cleared), or the version applied already (seen again)."""


@dataclass(frozen=True, slots=True)
class Ack:
    """What a router did with one desired-state message."""

    slot: str
    version: int | None
    ok: bool
    message: str

    def encode(self, router: str) -> bytes:
        body = {"v": CONTROL_VERSION, "router": router, "slot": self.slot}
        body |= {"version": self.version, "ok": self.ok, "message": self.message}
        return json.dumps(body, separators=(",", ":")).encode()
