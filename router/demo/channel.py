"""What the demo's console process and its children say to each other: JSON lines.

The lab (emulated fleet, node agents, load generator) and the router run in child processes
of their own (:mod:`router.demo.lab_child`, :mod:`router.demo.router_child`); the parent
writes to a child's stdin and reads its stdout, one JSON object per line, each with a
``type``. Closing a child's stdin (or the parent dying) stops it.

- to the lab: :class:`LabPlan` (first line), then :class:`StartLoad` and :class:`StopLoad`;
  from it: :class:`LabReady` or :class:`StartFailed` once started, :class:`ClientTally` a few
  times a second while the load runs, and :class:`LoadStopped` after a :class:`StopLoad`;
- to the router: :class:`RouterPlan` (its only line); from it: :class:`RouterReady` or
  :class:`StartFailed`. Everything else goes through its admin API, as to any router.

Plain JSON rather than pickles: the fleet travels as its file's path (the child reads the
same file), and everything else is numbers, strings and counts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from router.demo.load import DemoLoad

__all__ = [
    "ChildMessage",
    "ClientTally",
    "LabPlan",
    "LabReady",
    "LoadStopped",
    "RateStep",
    "RouterPlan",
    "RouterReady",
    "StartFailed",
    "StartLoad",
    "StopLoad",
    "decode",
    "encode",
]


@dataclass(frozen=True, slots=True)
class LabPlan:
    """Everything the lab needs to start."""

    fleet_file: str
    broker_url: str
    time_scale: float
    seed: int
    load: DemoLoad
    max_in_flight: int


@dataclass(frozen=True, slots=True)
class RateStep:
    """One phase of the offered load's cycle, in emulated seconds and requests per second."""

    duration_s: float
    rate_rps: float


@dataclass(frozen=True, slots=True)
class LabReady:
    capacity_rps: float
    """The fleet's physical limit on the demo's mix, requests per emulated second."""
    phases: tuple[RateStep, ...]
    """The load's cycle, repeated for as long as it runs."""
    agents: int
    """Node agents publishing over MQTT."""
    control_url: str
    """The emulator's fault API (router.emulator.control)."""


@dataclass(frozen=True, slots=True)
class RouterPlan:
    """Everything the demo's router needs to start (the strategy is the demo's own)."""

    fleet_file: str
    broker_url: str
    strategy: str
    listen: str | None
    admin_listen: str | None
    admin_token: str
    """The admin API's bearer token: the parent made it, and the pipe is private to the two
    processes (an argument or an environment variable can be read by others)."""


@dataclass(frozen=True, slots=True)
class RouterReady:
    front_url: str
    admin_url: str


@dataclass(frozen=True, slots=True)
class StartFailed:
    """A child could not start: ``os`` for a port it could not take, ``config`` otherwise."""

    kind: Literal["os", "config"]
    message: str
    errno: int | None = None
    listener: str | None = None
    """For a listener that could not take its address (``front door``, ``admin API``): which
    one, the address and the setting that moves it, so the parent says which flag to use."""
    address: str | None = None
    setting: str | None = None


@dataclass(frozen=True, slots=True)
class ClientTally:
    """How the load generator's requests ended so far."""

    client: dict[str, int] = field(default_factory=dict)
    """By outcome (``error``: no HTTP answer at all)."""
    errors: dict[str, int] = field(default_factory=dict)
    """What each request without an HTTP answer died of."""
    in_flight: int = 0
    """Requests the generator has sent and not yet seen end."""


@dataclass(frozen=True, slots=True)
class LoadStopped:
    tally: ClientTally


@dataclass(frozen=True, slots=True)
class StartLoad:
    front_url: str
    start_at: float
    """Time 0 of the schedule on the monotonic clock, which every process reads alike."""


@dataclass(frozen=True, slots=True)
class StopLoad:
    pass


ChildMessage = (
    LabPlan
    | LabReady
    | StartFailed
    | ClientTally
    | LoadStopped
    | StartLoad
    | StopLoad
    | RouterPlan
    | RouterReady
)

_TYPES: dict[str, type[ChildMessage]] = {
    "plan": LabPlan,
    "ready": LabReady,
    "failed": StartFailed,
    "tally": ClientTally,
    "load_stopped": LoadStopped,
    "start_load": StartLoad,
    "stop_load": StopLoad,
    "router_plan": RouterPlan,
    "router_ready": RouterReady,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(message: ChildMessage) -> bytes:
    """One line of JSON, newline included."""
    body = {"type": _NAMES[type(message)], **asdict(message)}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> ChildMessage:
    """The message on ``line``; ValueError if it is not one."""
    body = json.loads(line)
    if not isinstance(body, dict) or body.get("type") not in _TYPES:
        raise ValueError(f"not a lab message: {line[:200]!r}")
    kind = _TYPES[body.pop("type")]
    try:
        return _build(kind, body)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a malformed {kind.__name__}: {exc}") from None


def _build(kind: type[ChildMessage], body: dict[str, Any]) -> ChildMessage:
    """The nested dataclasses back from their dicts (asdict flattened them)."""
    if kind is LabPlan:
        return LabPlan(**{**body, "load": DemoLoad(**body["load"])})
    if kind is LabReady:
        steps = tuple(RateStep(**step) for step in body["phases"])
        return LabReady(**{**body, "phases": steps})
    if kind is LoadStopped:
        return LoadStopped(ClientTally(**body["tally"]))
    return kind(**body)
