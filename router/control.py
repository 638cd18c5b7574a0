"""The control surface: every operator action, as a typed command applied in one place.

The console, ``gpurouter ctl``, the admin HTTP API and the MQTT control topic are thin adapters
that build a :data:`Command` (``parse_command`` turns a JSON-like mapping into one) and call
:meth:`ControlSurface.apply`. A weight or batch size outside its range
(router/operator_values.py), or a NaN or infinity anywhere in a command, is refused by both,
whichever built the command. Each application is validated, applied to the core, written to the
audit trail with who and when, and published to subscribers as an :class:`Event`; replica
state changes the core makes on its own (a drain finishing, the health monitor's ejections and
readmissions, each with its reason), panic mode beginning and ending, and every setting the
adaptive tuners move are published the same way.

The trail is in causal order: what a command causes (the replica state changes of a drain, or
a panic it sets off) is recorded after the command itself, though the core makes those changes
while the command is being applied.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from router.adaptive import TunerChange
from router.core import CoreListener, RouterCore
from router.errors import ControlError
from router.operator_values import batch_size_problem, non_finite, weight_problem
from router.replica import Replica, ReplicaState
from router.rollout.split import TrafficSplit


@dataclass(frozen=True, slots=True)
class SetStrategy:
    """Route the next decisions with another strategy."""

    name: str
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class SetWeight:
    """Pin a replica's weight, or release it (None) to the static/adaptive value."""

    replica: str
    weight: float | None


@dataclass(frozen=True, slots=True)
class SetBatchSize:
    """Pin a replica's batch size, or release it (None)."""

    replica: str
    size: int | None


@dataclass(frozen=True, slots=True)
class Drain:
    """Send a replica no new work; it becomes drained when its in-flight work is done."""

    replica: str


@dataclass(frozen=True, slots=True)
class Undrain:
    """Return a draining or drained replica to service."""

    replica: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Free a replica now: its low-priority in-flight work is cancelled and re-queued."""

    replica: str
    include_high: bool = False


@dataclass(frozen=True, slots=True)
class Eject:
    """Take a replica out of service (as health checks do)."""

    replica: str


@dataclass(frozen=True, slots=True)
class Readmit:
    """Return an ejected replica to service."""

    replica: str


@dataclass(frozen=True, slots=True)
class SetSplit:
    """Send ``share`` (0..1) of the requests for ``model`` to the replicas of version ``new``,
    the rest to those of ``old`` (router/rollout/split.py): what a canary's step or a
    blue-green switch sets, published like any command so that every router applies it."""

    model: str
    old: str
    new: str
    share: float


@dataclass(frozen=True, slots=True)
class EndSplit:
    """End the traffic split: requests are routed by the name they give alone."""


Command = (
    SetStrategy
    | SetWeight
    | SetBatchSize
    | Drain
    | Undrain
    | Preempt
    | Eject
    | Readmit
    | SetSplit
    | EndSplit
)

COMMANDS: dict[str, type[Command]] = {
    "strategy": SetStrategy,
    "weight": SetWeight,
    "batch": SetBatchSize,
    "drain": Drain,
    "undrain": Undrain,
    "preempt": Preempt,
    "eject": Eject,
    "readmit": Readmit,
    "split": SetSplit,
    "unsplit": EndSplit,
}
_NAMES = {cls: name for name, cls in COMMANDS.items()}

log = logging.getLogger(__name__)

_Change = tuple[str, str, Mapping[str, Any], bool, str]
"""A change the router made: (actor, kind, args, ok, message), as :class:`Event` has them."""


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the audit trail."""

    seq: int
    at: float
    """Wall-clock time (Unix seconds)."""
    actor: str
    kind: str
    """The command's name (``drain``...); for a change the router made itself, ``state`` (a
    replica's state, actor ``router``, with its ``reason``), ``panic`` (panic mode began or
    ended, actor ``router``), ``tune`` (a weight or batch size the adaptive tuners moved,
    actor ``tuner``) or ``rollout`` (a step of a model rollout, actor ``rollout`` for the
    steps it takes, or the operator who started, paused or aborted it; router/rollout/)."""
    args: Mapping[str, Any]
    ok: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["args"] = dict(self.args)
        return d


@dataclass(frozen=True, slots=True)
class Applied:
    """A command given to one router, and where it was published to the cluster (``gpurouter
    serve``), what each router that acknowledged it did: router id -> applied (True) or
    refused (False)."""

    event: Event
    routers: Mapping[str, bool] | None = None
    """None: applied on this router alone (not published)."""


def command_name(command: Command) -> str:
    return _NAMES[type(command)]


def command_args(command: Command) -> dict[str, Any]:
    args = {f.name: getattr(command, f.name) for f in fields(command)}
    if isinstance(command, SetStrategy):
        args["params"] = dict(command.params)
    return args


def parse_command(data: Mapping[str, Any]) -> Command:
    """``{"command": "drain", "replica": "a100-0"}`` -> ``Drain("a100-0")``; ControlError if bad."""
    name = data.get("command")
    cls = COMMANDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ControlError(f"unknown command {name!r}; known: {', '.join(COMMANDS)}")
    args = {k: v for k, v in data.items() if k != "command"}
    for key, value in args.items():
        _check_type(cls.__name__ if name is None else str(name), key, value)
    try:
        command = cls(**args)
    except TypeError as exc:
        raise ControlError(f"{name}: {exc}".replace(f"{cls.__name__}.__init__() ", "")) from None
    if isinstance(command, SetStrategy):
        command = SetStrategy(command.name, MappingProxyType(dict(command.params)))
    check_values(command)
    return command


def check_values(command: Command) -> None:
    """ControlError for a value no operator means: a weight or batch size outside its range
    (router/operator_values.py), or a NaN or infinity in a strategy's parameters."""
    problem: str | None = None
    match command:
        case SetWeight(_, weight) if weight is not None:
            problem = weight_problem(weight)
        case SetBatchSize(_, size) if size is not None:
            problem = batch_size_problem(size)
        case SetStrategy(name, params) if non_finite(params):
            problem = f"strategy {name}: parameters must be finite numbers, not NaN or infinity"
        case SetSplit(_, old, new, share):
            if not 0.0 <= share <= 1.0:  # NaN fails this too
                problem = f"split: share must be within 0..1, not {share!r}"
            elif old == new:
                problem = f"split: needs two versions, got {old!r} twice"
    if problem is not None:
        raise ControlError(problem)


_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    # field -> (accepted types, None allowed)
    "replica": ((str,), False),
    "name": ((str,), False),
    "params": ((Mapping,), False),
    "weight": (_NUMBER, True),
    "size": ((int,), True),
    "include_high": ((bool,), False),
    "model": ((str,), False),
    "old": ((str,), False),
    "new": ((str,), False),
    "share": (_NUMBER, False),
}


def _check_type(command: str, key: str, value: object) -> None:
    if key not in _FIELD_TYPES:
        raise ControlError(f"{command}: unexpected keyword argument {key!r}")
    accepted, nullable = _FIELD_TYPES[key]
    if value is None and nullable:
        return
    is_bool = isinstance(value, bool)
    if not isinstance(value, accepted) or (is_bool and bool not in accepted):
        kinds = " or ".join(t.__name__ for t in accepted) + (" or null" if nullable else "")
        raise ControlError(f"{command}: {key} must be {kinds}, not {value!r}")


class ControlSurface(CoreListener):
    """Applies commands to a core and keeps the audit trail."""

    def __init__(
        self,
        core: RouterCore,
        *,
        wall_clock: Callable[[], float] = time.time,
        audit_size: int = 1000,
        run: str | None = None,
    ) -> None:
        self.core = core
        self.wall_clock = wall_clock
        self.run = run if run is not None else secrets.token_hex(8)
        """This trail's id, random unless given: events are numbered from 1 in each run, so a
        reader that resumes after a sequence number (an attached console) learns from a new id
        that the router restarted and its numbers began again."""
        self.audit: deque[Event] = deque(maxlen=audit_size)
        self._subscribers: list[Callable[[Event], None]] = []
        self._seq = 0
        self._unpublished: deque[Event] = deque()
        self._publishing = False
        self._caused: list[_Change] | None = None
        """While a command is applied: the changes it caused, recorded after it."""
        core.listeners.append(self)

    def apply(self, command: Command, actor: str = "operator") -> Event:
        """Apply a command; the returned event says whether it worked and what happened.
        Changes the command caused follow it in the trail."""
        outer, self._caused = self._caused, []
        try:
            message = self._run(command, f"by {actor}")
            ok = True
        except ControlError as exc:
            message, ok = str(exc), False
        finally:
            caused, self._caused = self._caused, outer
        event = self._record(actor, command_name(command), command_args(command), ok, message)
        for change in caused:
            self._record(*change)
        return event

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``callback`` with every new event; returns a function that unsubscribes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        reason = replica.state_reason
        args = {"replica": replica.id, "from": str(old), "to": str(replica.state), "reason": reason}
        message = f"{replica.id}: {old} -> {replica.state}" + (f" ({reason})" if reason else "")
        self._change(("router", "state", args, True, message))

    def on_panic(self, engaged: bool, reason: str) -> None:
        if engaged:
            message = f"PANIC: {reason}: routing to every replica in service"
        else:
            message = f"panic over: {reason}: routing by health again"
        self._change(("router", "panic", {"engaged": engaged, "reason": reason}, True, message))

    def on_tune(self, changes: list[TunerChange]) -> None:
        """One ``tune`` event per setting moved, actor ``tuner``, in the tuner's order."""
        for c in changes:
            args = {
                "replica": c.replica,
                "setting": c.setting,
                "old": c.old,
                "new": c.new,
                "signal": c.signal,
            }
            self._change(("tuner", "tune", args, True, c.message))

    def note(self, actor: str, kind: str, args: Mapping[str, Any], ok: bool, message: str) -> None:
        """Record a change the router made outside a command (a rollout's step), in causal
        order like the core's own changes, and publish it."""
        self._change((actor, kind, dict(args), ok, message))

    def _change(self, change: _Change) -> None:
        if self._caused is not None:
            self._caused.append(change)  # a command is being applied: it goes first
        else:
            self._record(*change)

    def _run(self, command: Command, reason: str) -> str:
        """Apply to the core; ``reason`` (``by alice``) is what a replica's state change says."""
        check_values(command)  # a command built in code (the console) was not parsed
        core = self.core
        match command:
            case SetStrategy(name, params):
                return core.set_strategy(name, dict(params))
            case SetWeight(replica, weight):
                return core.set_weight(replica, weight)
            case SetBatchSize(replica, size):
                return core.set_batch_size(replica, size)
            case Drain(replica):
                return core.drain(replica, reason)
            case Undrain(replica):
                return core.undrain(replica, reason)
            case Preempt(replica, include_high):
                return core.preempt(replica, include_high=include_high, reason=reason)
            case Eject(replica):
                return core.eject(replica, reason)
            case Readmit(replica):
                return core.readmit(replica, reason)
            case SetSplit(model, old, new, share):
                core.set_split(TrafficSplit(model, old, new, float(share)))
                return f"split: {share:.0%} of {model} to {new}, the rest to {old}"
            case EndSplit():
                core.set_split(None)
                return "split ended: requests go by the name they give"
        raise ControlError(f"unsupported command {command!r}")

    def _record(
        self, actor: str, kind: str, args: Mapping[str, Any], ok: bool, message: str
    ) -> Event:
        self._seq += 1
        event = Event(self._seq, self.wall_clock(), actor, kind, args, ok, message)
        self.audit.append(event)
        self._unpublished.append(event)
        if not self._publishing:  # else a subscriber caused this event: the loop below has it
            self._publish()
        return event

    def _publish(self) -> None:
        """Every subscriber sees every event in sequence order, even one recorded from inside
        a subscriber; a subscriber that raises is logged, and neither stops the others nor
        reaches the core that caused the event."""
        self._publishing = True
        try:
            while self._unpublished:
                event = self._unpublished.popleft()
                for callback in list(self._subscribers):
                    try:
                        callback(event)
                    except Exception:
                        log.exception("event subscriber %r failed on event %d", callback, event.seq)
        finally:
            self._publishing = False
