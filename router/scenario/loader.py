"""Scenario files: YAML in, a checked :class:`~router.scenario.schema.Scenario` out.

As strict as the fleet loader (``router.config.loader``) and in the same terms: unknown keys,
wrong types and impossible values are errors; every problem in the file is reported at once,
each with its line and dotted key (``checks[2].max``), as one ConfigError. The fleet file the
scenario names is read with the fleet loader, so its problems come with its own name and lines.
Control actions are parsed by ``router.control.parse_command``, the same function every other
operator adapter uses, and every replica a scenario names must be in the fleet.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.control import Command, EndSplit, SetSplit, SetStrategy, parse_command
from router.errors import ConfigError, ControlError, Problem
from router.replica import ReplicaState
from router.request import Priority
from router.rollout.canary import CanaryPhase
from router.rollout.executor import Phase as RolloutPhase
from router.rollout.templates import VERSION_NAME
from router.scenario.canary_step import CanaryStep, read_canary_step
from router.scenario.checks import (
    CANARY,
    COUNTS,
    LATENCIES,
    METRICS,
    PER_SECOND,
    ROLLOUT,
    expected_text,
)
from router.scenario.rollout_step import read_rollout_step
from router.scenario.schema import FAULTS, Action, Check, FleetRef, Lengths, Phase, Scenario
from router.yaml_lines import FILE_KEY, LineList, LineMap, parse_yaml, read_yaml

__all__ = ["load_scenario", "parse_scenario"]

_TOP = (
    "name",
    "description",
    "seed",
    "fleet",
    "strategy",
    "workload",
    "drain",
    "actions",
    "checks",
)
_FLEET = ("file", "emulated", "time_scale")
_WORKLOAD = ("lengths", "priorities", "arrivals", "burstiness", "max_tokens", "phases")
_PHASE = (
    "name",
    "duration",
    "rate",
    "load",
    "arrivals",
    "burstiness",
    "lengths",
    "priorities",
    "max_tokens",
)
_CHECK = ("name", "metric", "from", "to", "at", "replica", "priority", "min", "max", "equals")
_CHECK_ALL = (*_CHECK, "aggregate")
_FAULT_KEYS = ("at", "fault", "replica", "factor", "fraction", "version")
_TRACES = ("conv", "code")

_REPLICA_METRICS = frozenset({"utilization", "dispatched", "throughput_rps", "completed", "failed"})
"""Metrics that may be narrowed to one replica (``utilization`` must be)."""
_PRIORITY_METRICS = frozenset({*LATENCIES, *COUNTS} - {"lost"})

_MISSING: Any = object()


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    return "a list" if isinstance(value, list) else "a mapping"


def _unknown(what: str, value: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(value, list(known), n=1)
    if close:
        return f"unknown {what} {value!r}; did you mean {close[0]!r}?"
    return f"unknown {what} {value!r}; expected one of: {', '.join(known)}"


@dataclass
class _Reader:
    """Reads one scenario file, noting each problem instead of stopping at the first."""

    source: str
    problems: list[Problem] = field(default_factory=list)

    def problem(self, line: int | None, path: str, message: str) -> None:
        self.problems.append(Problem(self.source, line, path or FILE_KEY, message))

    def mapping(self, value: Any, path: str, line: int | None) -> LineMap | None:
        if isinstance(value, LineMap):
            return value
        self.problem(line, path, f"expected a mapping, got {_describe(value)}")
        return None

    def keys(
        self, m: LineMap, path: str, allowed: Collection[str], required: Collection[str] = ()
    ) -> None:
        for dup in m.duplicates:
            self.problem(
                dup.line, _join(path, dup.key), f"given twice (first at line {dup.first_line})"
            )
        for key, line in m.key_lines.items():
            if not isinstance(key, str):
                self.problem(
                    line, _join(path, key), f"a key must be a string, got {_describe(key)}"
                )
            elif key not in allowed:
                self.problem(line, _join(path, key), _unknown("key", key, allowed))
        for key in required:
            if key not in m:
                self.problem(m.line, _join(path, key), f"missing required key {key!r}")

    def value(self, m: LineMap, path: str, key: str, kind: type, default: Any = _MISSING) -> Any:
        """``m[key]`` checked to be a ``kind`` (float accepts ints); ``default`` if absent."""
        if key not in m:
            return None if default is _MISSING else default
        value = m[key]
        line = m.key_lines[key]
        if kind is float:
            good = isinstance(value, int | float) and not isinstance(value, bool)
            good = good and math.isfinite(value)
            value = float(value) if good else value
        elif kind is int:
            good = isinstance(value, int) and not isinstance(value, bool)
        else:
            good = isinstance(value, kind)
        if good:
            return value
        names = {float: "a number", int: "an integer", bool: "true or false", str: "text"}
        self.problem(line, _join(path, key), f"expected {names[kind]}, got {_describe(value)}")
        return None

    def number(
        self,
        m: LineMap,
        path: str,
        key: str,
        default: Any = _MISSING,
        *,
        above: float | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> float | None:
        value = self.value(m, path, key, float, default)
        if value is None or key not in m:
            return cast(float | None, value)
        line, where = m.key_lines[key], _join(path, key)
        if above is not None and not value > above:
            self.problem(line, where, f"must be > {above:g}, got {value:g}")
            return None
        if at_least is not None and not value >= at_least:
            self.problem(line, where, f"must be >= {at_least:g}, got {value:g}")
            return None
        if at_most is not None and not value <= at_most:
            self.problem(line, where, f"must be <= {at_most:g}, got {value:g}")
            return None
        return cast(float, value)

    def choice(
        self, m: LineMap, path: str, key: str, known: Collection[str], default: Any = _MISSING
    ) -> str | None:
        value = self.value(m, path, key, str, default)
        if value is None or key not in m or value in known:
            return cast(str | None, value)
        self.problem(m.key_lines[key], _join(path, key), _unknown(key, value, known))
        return None

    def items(self, value: Any, path: str, line: int | None) -> list[tuple[str, int, Any]]:
        """(dotted key, line, item) of a list."""
        if value is None:
            return []
        if not isinstance(value, LineList):
            self.problem(line, path, f"expected a list, got {_describe(value)}")
            return []
        pairs = enumerate(zip(value.item_lines, value, strict=True))
        return [(f"{path}[{i}]", ln, v) for i, (ln, v) in pairs]


# ---- the parts --------------------------------------------------------------------------


def _fleet(r: _Reader, doc: LineMap, directory: Path) -> FleetRef | None:
    if "fleet" not in doc:
        return None
    raw, line = doc["fleet"], doc.key_lines["fleet"]
    key_path = "fleet" if isinstance(raw, str) else "fleet.file"
    m = _short_form(raw, "file", line) if isinstance(raw, str) else r.mapping(raw, "fleet", line)
    if m is None:
        return None
    r.keys(m, "fleet", _FLEET, required=("file",))
    file = r.value(m, "fleet", "file", str)
    emulated = r.value(m, "fleet", "emulated", bool, True)
    time_scale = r.number(m, "fleet", "time_scale", 1.0, above=0)
    if not isinstance(file, str):
        return None
    path = directory / file
    if not path.is_file():
        where = "" if Path(file).is_absolute() else " (relative paths start at the scenario file)"
        r.problem(m.key_lines.get("file", line), key_path, f"no such file: {path}{where}")
        return None
    try:
        config = load_fleet(path)
    except ConfigError as exc:
        r.problems.extend(exc.problems)
        return None
    if emulated is None or time_scale is None:
        return None
    return FleetRef(path, config, emulated, time_scale)


def _short_form(value: str, key: str, line: int) -> LineMap:
    """``fleet: FILE`` read as ``fleet: {file: FILE}`` (and the like)."""
    m = LineMap(line)
    m[key], m.key_lines[key] = value, line
    return m


def _strategy(r: _Reader, doc: LineMap) -> tuple[str | None, Mapping[str, object] | None]:
    if "strategy" not in doc:
        return None, None
    raw, line = doc["strategy"], doc.key_lines["strategy"]
    path = "strategy" if isinstance(raw, str) else "strategy.name"
    m = _short_form(raw, "name", line) if isinstance(raw, str) else r.mapping(raw, "strategy", line)
    if m is None:
        return None, None
    r.keys(m, "strategy", ("name", "params"), required=("name",))
    name = r.value(m, "strategy", "name", str)
    params: Mapping[str, Any] | None = LineMap(line)
    if "params" in m:
        params = r.mapping(m["params"], "strategy.params", m.key_lines["params"])
    if name is None or params is None:
        return None, None
    message = _strategy_problem(name, params)
    if message:
        r.problem(line, path, message)
        return None, None
    return name, MappingProxyType(dict(params))


def _strategy_problem(name: str, params: Mapping[str, Any]) -> str | None:
    # Imported here: router.strategies is heavy and only strategy checks need it.
    from router.strategies import create_strategy

    try:
        create_strategy(name, params)
    except ControlError as exc:
        return str(exc)
    return None


def _lengths(r: _Reader, raw: Any, path: str, line: int, directory: Path) -> Lengths | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    r.keys(m, path, ("trace", "csv", "lognormal"))
    given = [k for k in ("trace", "csv", "lognormal") if k in m]
    if len(given) != 1:
        r.problem(m.line, path, "give exactly one of trace, csv or lognormal")
        return None
    key = given[0]
    if key == "trace":
        trace = r.choice(m, path, "trace", _TRACES)
        return None if trace is None else Lengths(trace=trace)
    if key == "csv":
        csv = r.value(m, path, "csv", str)
        if csv is None:
            return None
        file = directory / csv
        if not file.is_file():
            r.problem(m.key_lines["csv"], _join(path, "csv"), f"no such file: {file}")
            return None
        return Lengths(csv=file)
    return _lognormal(r, m["lognormal"], _join(path, "lognormal"), m.key_lines["lognormal"])


def _lognormal(r: _Reader, raw: Any, path: str, line: int) -> Lengths | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    r.keys(m, path, ("prompt", "output"), required=("prompt", "output"))
    pairs: list[tuple[float, float]] = []
    for key in ("prompt", "output"):
        value: Any = m.get(key)
        good = (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        )
        if key in m and not good:
            r.problem(m.key_lines[key], _join(path, key), "expected [median, mean] in tokens")
        elif key in m:
            median, mean = float(value[0]), float(value[1])
            if not 0 < median <= mean:
                message = f"needs 0 < median <= mean, got [{median:g}, {mean:g}]"
                r.problem(m.key_lines[key], _join(path, key), message)
            else:
                pairs.append((median, mean))
    return Lengths(lognormal=(pairs[0], pairs[1])) if len(pairs) == 2 else None


def _priorities(r: _Reader, raw: Any, path: str, line: int) -> Mapping[Priority, float] | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    names = [p.name.lower() for p in Priority]
    r.keys(m, path, names)
    shares = {Priority[k.upper()]: r.number(m, path, k, at_least=0) for k in names if k in m}
    if any(v is None for v in shares.values()):
        return None
    total = sum(cast(float, v) for v in shares.values())
    if total <= 0:
        r.problem(m.line, path, "the shares must add up to more than 0")
        return None
    return MappingProxyType({p: cast(float, v) / total for p, v in shares.items()})


_CONV = Lengths(trace="conv")


@dataclass
class _Defaults:
    lengths: Lengths | None = _CONV
    priorities: Mapping[Priority, float] | None = field(
        default_factory=lambda: MappingProxyType({Priority.NORMAL: 1.0})
    )
    arrivals: str | None = "poisson"
    burstiness: float | None = 1.0
    max_tokens: int | None = None
    """None: each client sends its request's own output length (not an error)."""


def _workload(r: _Reader, doc: LineMap, directory: Path) -> tuple[Phase, ...] | None:
    if "workload" not in doc:
        return None
    m = r.mapping(doc["workload"], "workload", doc.key_lines["workload"])
    if m is None:
        return None
    r.keys(m, "workload", _WORKLOAD, required=("phases",))
    defaults = _Defaults()
    _read_defaults(r, m, "workload", defaults, directory)
    phases: list[Phase | None] = []
    start = 0.0
    rows = r.items(m.get("phases"), "workload.phases", m.key_lines.get("phases", m.line))
    if "phases" in m and not rows and isinstance(m["phases"], list):
        r.problem(m.key_lines["phases"], "workload.phases", "must not be empty")
    for path, line, raw in rows:
        phase = _phase(r, raw, path, line, defaults, start, directory)
        phases.append(phase)
        start = phase.end_s if phase is not None else math.nan
    if not phases or any(p is None for p in phases):
        return None
    return tuple(cast(Phase, p) for p in phases)


def _read_defaults(r: _Reader, m: LineMap, path: str, d: _Defaults, directory: Path) -> None:
    if "lengths" in m:
        d.lengths = _lengths(
            r, m["lengths"], _join(path, "lengths"), m.key_lines["lengths"], directory
        )
    if "priorities" in m:
        d.priorities = _priorities(
            r, m["priorities"], _join(path, "priorities"), m.key_lines["priorities"]
        )
    d.arrivals = r.choice(m, path, "arrivals", ("poisson", "gamma"), d.arrivals)
    d.burstiness = r.number(m, path, "burstiness", d.burstiness, above=0)
    if "max_tokens" in m:
        cap = r.value(m, path, "max_tokens", int)
        if cap is not None and cap < 1:
            where = _join(path, "max_tokens")
            r.problem(m.key_lines["max_tokens"], where, f"must be >= 1, got {cap}")
            cap = None
        d.max_tokens = cap


def _phase(
    r: _Reader,
    raw: Any,
    path: str,
    line: int,
    inherited: _Defaults,
    start: float,
    directory: Path,
) -> Phase | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    r.keys(m, path, _PHASE, required=("duration",))
    own = _Defaults(
        inherited.lengths,
        inherited.priorities,
        inherited.arrivals,
        inherited.burstiness,
        inherited.max_tokens,
    )
    _read_defaults(r, m, path, own, directory)
    name = r.value(m, path, "name", str, "")
    duration = r.number(m, path, "duration", above=0)
    rate = r.number(m, path, "rate", above=0)
    load = r.number(m, path, "load", above=0)
    if ("rate" in m) == ("load" in m):
        r.problem(m.line, path, "give exactly one of rate (requests/s) or load (x capacity_rps)")
        return None
    if None in (duration, own.lengths, own.priorities, own.arrivals, own.burstiness, name) or (
        rate is None and load is None
    ):
        return None
    return Phase(
        start_s=start,
        duration_s=cast(float, duration),
        rate_rps=rate,
        load=load,
        arrivals=cast(Any, own.arrivals),
        burstiness=cast(float, own.burstiness),
        lengths=cast(Lengths, own.lengths),
        priorities=cast(Mapping[Priority, float], own.priorities),
        name=cast(str, name),
        max_tokens=own.max_tokens,
    )


def _replica(
    r: _Reader, m: LineMap, path: str, fleet: FleetConfig | None, *, required: bool
) -> str | None:
    if "replica" not in m:
        if required:
            r.problem(m.line, _join(path, "replica"), "missing required key 'replica'")
        return None
    value = r.value(m, path, "replica", str)
    if value is None or fleet is None:
        return cast(str | None, value)
    ids = [rep.id for rep in fleet.replicas]
    if value not in ids:
        r.problem(m.key_lines["replica"], _join(path, "replica"), _unknown("replica", value, ids))
        return None
    return cast(str, value)


def _action(
    r: _Reader, raw: Any, path: str, line: int, fleet: FleetConfig | None, emulated: bool
) -> Action | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    at = r.number(m, path, "at", at_least=0)
    if "at" not in m:
        r.problem(m.line, _join(path, "at"), "missing required key 'at' (seconds from the start)")
    if sum(1 for kind in ("command", "fault", "rollout", "canary") if kind in m) != 1:
        message = "give exactly one of command (a control command), fault, rollout or canary"
        r.problem(m.line, path, message)
        return None
    if "rollout" in m or "canary" in m:
        kind = "rollout" if "rollout" in m else "canary"
        r.keys(m, path, ("at", kind))
        return _rollout(r, m, path, at, fleet, emulated, kind)
    if "fault" in m:
        r.keys(m, path, _FAULT_KEYS)
        return _fault(r, m, path, at, fleet)
    for dup in m.duplicates:
        r.problem(dup.line, _join(path, dup.key), f"given twice (first at line {dup.first_line})")
    args = {k: _plain(v) for k, v in m.items() if k != "at"}
    try:
        command = parse_command(args)
    except ControlError as exc:
        r.problem(m.line, path, str(exc))
        return None
    if not _command_ok(r, m, path, command, fleet) or at is None:
        return None
    return Action(at_s=at, line=m.line, command=command)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _command_ok(
    r: _Reader, m: LineMap, path: str, command: Command, fleet: FleetConfig | None
) -> bool:
    if isinstance(command, SetStrategy):
        message = _strategy_problem(command.name, command.params)
        if message:
            r.problem(m.key_lines.get("name", m.line), _join(path, "name"), message)
        return message is None
    if isinstance(command, SetSplit | EndSplit):
        return True  # names versions, not a replica
    return _replica(r, m, path, fleet, required=True) is not None or fleet is None


def _fault(
    r: _Reader, m: LineMap, path: str, at: float | None, fleet: FleetConfig | None
) -> Action | None:
    fault = r.choice(m, path, "fault", FAULTS)
    replica = _replica(r, m, path, fleet, required=True)
    factor = r.number(m, path, "factor", 1.0, above=0)
    fraction = r.number(m, path, "fraction", 0.0, at_least=0, at_most=1)
    if fault == "slow" and "factor" not in m:
        r.problem(m.line, _join(path, "factor"), "slow needs a factor (> 0)")
        return None
    if fault == "fail_fraction" and "fraction" not in m:
        r.problem(m.line, _join(path, "fraction"), "fail_fraction needs a fraction (0..1)")
        return None
    for key, owner in (("factor", "slow"), ("fraction", "fail_fraction")):
        if key in m and fault is not None and fault != owner:
            r.problem(m.key_lines[key], _join(path, key), f"only {owner} takes {key}")
            return None
    version = r.value(m, path, "version", str, None)
    if "version" in m and fault not in ("slow", "fail_fraction"):
        message = "only slow and fail_fraction take a version"
        r.problem(m.key_lines["version"], _join(path, "version"), message)
        return None
    if version is not None and not VERSION_NAME.match(version):
        message = f"must be a model name such as org/model-v2, got {version!r}"
        r.problem(m.key_lines["version"], _join(path, "version"), message)
        return None
    if None in (at, fault, replica, factor, fraction):
        return None
    return Action(
        at_s=cast(float, at),
        line=m.line,
        fault=cast(Any, fault),
        replica=replica,
        factor=cast(float, factor),
        fraction=cast(float, fraction),
        version=cast(str | None, version),
    )


def _rollout(
    r: _Reader,
    m: LineMap,
    path: str,
    at: float | None,
    fleet: FleetConfig | None,
    emulated: bool,
    kind: str = "rollout",
) -> Action | None:
    where = _join(path, kind)
    body = r.mapping(m[kind], where, m.key_lines[kind])
    if body is None:
        return None
    read = read_rollout_step if kind == "rollout" else read_canary_step
    step, problems = read(body, fleet, emulated)
    for line, key, message in problems:
        r.problem(line, _join(where, key), message)
    if step is None or at is None:
        return None
    if isinstance(step, CanaryStep):
        return Action(at_s=at, line=m.line, canary=step)
    return Action(at_s=at, line=m.line, rollout=step)


def _check(r: _Reader, raw: Any, path: str, line: int, fleet: FleetConfig | None) -> Check | None:
    m = r.mapping(raw, path, line)
    if m is None:
        return None
    r.keys(m, path, _CHECK_ALL, required=("metric",))
    metric = r.choice(m, path, "metric", METRICS)
    if metric is None:
        return None
    bad = _check_keys(metric, m)
    for key in bad:
        r.problem(m.key_lines[key], _join(path, key), f"does not apply to metric {metric!r}")
    start = r.number(m, path, "from", 0.0, at_least=0)
    end = r.number(m, path, "to", None, at_least=0)
    at = r.number(m, path, "at", None, at_least=0)
    minimum = r.number(m, path, "min", None)
    maximum = r.number(m, path, "max", None)
    replica = _replica(r, m, path, fleet, required=metric in ("state", "utilization"))
    priority = _priority(r, m, path)
    aggregate = r.choice(m, path, "aggregate", ("all", "mean"), "all")
    equals = _equals(r, m, path, metric)
    if metric == "state":
        for key in ("at", "equals"):
            if key not in m:
                r.problem(m.line, _join(path, key), f"missing required key {key!r} for state")
    elif metric in _PHASES:
        if "equals" not in m:
            example = "done" if metric == "rollout_phase" else "rolled back"
            r.problem(m.line, _join(path, "equals"), f"missing required key 'equals' ({example})")
    elif "min" not in m and "max" not in m:
        r.problem(m.line, path, "give min, max or both")
        return None
    if start is not None and end is not None and end <= start:
        r.problem(m.key_lines["to"], _join(path, "to"), f"must be after from ({start:g})")
        return None
    needs_equals = metric in ("state", *_PHASES)
    if (
        bad
        or None in (start, aggregate)
        or (needs_equals and equals is None)
        or (metric == "state" and at is None)
    ):
        return None
    check = Check(
        name="",
        metric=metric,
        line=m.line,
        start_s=cast(float, start),
        end_s=end,
        at_s=at,
        replica=replica,
        priority=priority,
        minimum=minimum,
        maximum=maximum,
        equals=equals,
        aggregate=cast(Any, aggregate),
    )
    name = r.value(m, path, "name", str, "") or _default_name(check)
    return Check(**{**_fields(check), "name": name})


def _fields(check: Check) -> dict[str, Any]:
    return {name: getattr(check, name) for name in Check.__dataclass_fields__}


def _equals(r: _Reader, m: LineMap, path: str, metric: str) -> str | None:
    if metric == "state":
        return r.choice(m, path, "equals", [s.value for s in ReplicaState])
    if metric == "rollout_phase":
        return r.choice(m, path, "equals", [p.value for p in RolloutPhase])
    if metric == "canary_phase":
        return r.choice(m, path, "equals", [p.value for p in CanaryPhase])
    return None


def _check_keys(metric: str, m: LineMap) -> list[str]:
    """Keys given that the metric does not take."""
    bad = []
    if metric in ROLLOUT or metric in CANARY:
        # Read once, at the end of the run, from the rollout's or canary's own status.
        only = ("equals",) if metric in _PHASES else ("min", "max")
        bad += [k for k in _CHECK_ALL if k in m and k not in (*only, "name", "metric")]
    elif metric == "state":
        bad += [k for k in ("from", "to", "min", "max", "priority", "aggregate") if k in m]
    else:
        bad += [k for k in ("at", "equals") if k in m]
        if "replica" in m and metric not in _REPLICA_METRICS:
            bad.append("replica")
        if "priority" in m and metric not in _PRIORITY_METRICS:
            bad.append("priority")
        if "aggregate" in m and metric not in PER_SECOND:
            bad.append("aggregate")
    return bad


def _priority(r: _Reader, m: LineMap, path: str) -> Priority | None:
    if "priority" not in m:
        return None
    value = m["priority"]
    try:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(f"expected high, normal or low, got {_describe(value)}")
        return Priority.parse(value)
    except ValueError as exc:
        r.problem(m.key_lines["priority"], _join(path, "priority"), str(exc))
        return None


def _default_name(c: Check) -> str:
    subject = c.metric
    if c.replica:
        subject += f"[{c.replica}]"
    if c.priority is not None:
        subject += f"[{c.priority.name.lower()}]"
    if c.metric == "state":
        return f"{subject} at {c.at_s:g}s == {c.equals}"
    if c.metric in _PHASES:
        return f"{subject} == {c.equals}"
    if c.metric in PER_SECOND and c.aggregate == "mean":
        subject = f"mean {subject}"
    window = f" from {c.start_s:g}s" if c.start_s else ""
    window += f" to {c.end_s:g}s" if c.end_s is not None else ""
    return f"{subject} {expected_text(c)}{window}"


# ---- entry points ------------------------------------------------------------------------


def parse_scenario(text: str, source: str, directory: str | Path | None = None) -> Scenario:
    """Build a scenario from YAML text; relative paths start at ``directory``."""
    return _build(parse_yaml(text, source), source, Path(directory or "."))


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file. Raises ConfigError listing every problem in it."""
    path = Path(path)
    return _build(read_yaml(path), str(path), path.parent)


def _build(document: Any, source: str, directory: Path) -> Scenario:
    r = _Reader(source)
    if document is None:
        r.problem(1, "", "the file is empty; a scenario needs fleet and workload")
        raise ConfigError(r.problems)
    doc = r.mapping(document, "", 1)
    if doc is None:
        raise ConfigError(r.problems)
    r.keys(doc, "", _TOP, required=("fleet", "workload"))
    fleet = _fleet(r, doc, directory)
    config = fleet.config if fleet is not None else None
    emulated = fleet.emulated if fleet is not None else True
    name = r.value(doc, "", "name", str, Path(source).stem)
    description = r.value(doc, "", "description", str, "")
    seed = r.value(doc, "", "seed", int, 0)
    drain = r.number(doc, "", "drain", 30.0, at_least=0)
    strategy, params = _strategy(r, doc)
    phases = _workload(r, doc, directory)
    actions = [
        _action(r, raw, path, line, config, emulated)
        for path, line, raw in r.items(doc.get("actions"), "actions", doc.key_lines.get("actions"))
    ]
    checks = [
        _check(r, raw, path, line, config)
        for path, line, raw in r.items(doc.get("checks"), "checks", doc.key_lines.get("checks"))
    ]
    if phases is not None:
        _check_times(r, phases, actions, checks, drain or 0.0)
    _check_rollouts(r, doc, actions, checks)
    if r.problems:
        own = sorted((p for p in r.problems if p.file == source), key=lambda p: p.line or 0)
        raise ConfigError(own + [p for p in r.problems if p.file != source])
    ok_actions = [cast(Action, a) for a in actions]
    return Scenario(
        name=cast(str, name),
        source=Path(source),
        fleet=cast(FleetRef, fleet),
        phases=cast(tuple[Phase, ...], phases),
        actions=tuple(sorted(ok_actions, key=lambda a: a.at_s)),
        checks=tuple(cast(Check, c) for c in checks),
        description=cast(str, description),
        strategy=strategy,
        strategy_params=params,
        seed=cast(int, seed),
        drain_s=cast(float, drain),
    )


_PHASES = ("rollout_phase", "canary_phase")
"""Metrics that compare a phase's name (``equals:``)."""


def _check_rollouts(
    r: _Reader, doc: LineMap, actions: list[Action | None], checks: list[Check | None]
) -> None:
    """One rollout per run (its checks read *the* rollout), and rollout checks need one."""
    rollouts = [(i, a) for i, a in enumerate(actions) if a is not None and a.rollout is not None]
    for i, a in rollouts[1:]:
        r.problem(a.line, f"actions[{i}].rollout", "one rollout per scenario")
    canaries = [(i, a) for i, a in enumerate(actions) if a is not None and a.canary is not None]
    for i, a in canaries[1:]:
        r.problem(a.line, f"actions[{i}].canary", "one canary per scenario")
    raws = [raw for raw in doc.get("actions") or [] if isinstance(raw, dict)]
    for kind, metrics in (("rollout", ROLLOUT), ("canary", CANARY)):
        given = any(kind in raw for raw in raws)
        for i, c in enumerate(checks):
            if c is not None and c.metric in metrics and not given:
                r.problem(c.line, f"checks[{i}].metric", f"{c.metric} needs a {kind} action")


def _check_times(
    r: _Reader,
    phases: tuple[Phase, ...],
    actions: list[Action | None],
    checks: list[Check | None],
    drain: float,
) -> None:
    """Actions happen while load runs; windows and instants fall inside the run."""
    duration = phases[-1].end_s
    for i, a in enumerate(actions):
        if a is not None and a.at_s > duration:
            r.problem(a.line, f"actions[{i}].at", f"is after the workload ends ({duration:g} s)")
    end = duration + drain
    for i, c in enumerate(checks):
        if c is None:
            continue
        times = {"from": c.start_s, "to": c.end_s, "at": c.at_s}
        for key, t in times.items():
            if t is not None and t > end:
                message = f"is after the run ends ({duration:g} s of load + {drain:g} s drain)"
                r.problem(c.line, f"checks[{i}].{key}", message)
