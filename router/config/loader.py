"""Fleet files: YAML in, the frozen objects of :mod:`router.config.schema` out.

The loader is strict and kind. It rejects unknown keys, wrong types and impossible values, and
it reports every problem in the file at once, each with its line and dotted key
(``nodes[1].replicas[0].weight``), as one :class:`~router.errors.ConfigError`.

Keys and types come from the dataclasses themselves (their fields and type hints), so the
schema is the one source of truth. What a type cannot say is in four tables: ``_RULES``
(ranges, names, URLs), ``_DERIVED`` (fields the loader fills, never the file),
``_INHERITED`` (fields a file may leave to an enclosing object) and ``_MOVED`` (keys that
used to exist, with where their setting lives now). Checks that span several objects (unique
names, GPUs missing or shared, tensor parallelism over mixed models, the strategy's
parameters, the profile files a fleet names) are in ``_complete``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlsplit

from router.config.schema import (
    AdaptiveConfig,
    BrokerConfig,
    CanaryConfig,
    CommandUpdaterConfig,
    ConsoleConfig,
    ControlConfig,
    CostConfig,
    FleetConfig,
    GpuConfig,
    HealthConfig,
    HttpUpdaterConfig,
    NodeConfig,
    QueueConfig,
    ReplicaConfig,
    RetryConfig,
    RolloutConfig,
    RouterConfig,
    ServerConfig,
    StrategyConfig,
    TimeoutConfig,
    UpdaterConfig,
)
from router.errors import ConfigError, ControlError, Problem
from router.operator_values import MAX_BATCH_SIZE, MAX_WEIGHT, MIN_WEIGHT
from router.perf.profiles import ProfileCatalog, UnknownProfileError, load_catalog
from router.rollout.templates import (
    SAMPLE,
    VERSION_NAME,
    fill,
    split_command,
    template_problem,
)
from router.yaml_lines import FILE_KEY, LineList, LineMap, parse_yaml, read_yaml

__all__ = ["load_fleet", "parse_fleet", "parse_rollout_settings", "unprofiled_kinds"]

_T = TypeVar("_T")
_EXTENSION = "x-"
"""Top-level keys with this prefix are ignored: a place for YAML anchors to share settings."""


# --- rules a type hint cannot state -------------------------------------------------------

Rule = Callable[[Any], str | None]
"""Takes a converted, non-null value; returns what is wrong with it, or None."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _above(low: float) -> Rule:
    return lambda v: None if v > low else f"must be > {low}, got {v!r}"


def _at_least(low: float) -> Rule:
    return lambda v: None if v >= low else f"must be >= {low}, got {v!r}"


def _percent(v: float) -> str | None:
    return None if 0 <= v <= 100 else f"must be between 0 and 100, got {v!r}"


def _within(low: float, high: float) -> Rule:
    return lambda v: None if low <= v <= high else f"must be from {low:g} to {high:g}, got {v!r}"


def _both(first: Rule, second: Rule) -> Rule:
    """The first rule's problem, else the second's."""
    return lambda v: first(v) or second(v)


def _largest_at_most(high: int) -> Rule:
    return lambda v: None if v[1] <= high else f"the largest must be <= {high}, got {v[1]!r}"


def _bounds(low_limit: float, strict: bool) -> Rule:
    sign = "<" if strict else "<="

    def check(v: tuple[float, float]) -> str | None:
        low, high = v
        fits = (low > low_limit if strict else low >= low_limit) and low <= high
        return None if fits else f"must be [low, high] with {low_limit} {sign} low <= high"

    return check


def _name(v: str) -> str | None:
    # Node and cluster names are MQTT topic levels, and ids are typed at the console.
    if _NAME.match(v):
        return None
    return f"must be letters, digits, '.', '_' or '-', starting with a letter or digit; got {v!r}"


def _not_empty(v: str | tuple[Any, ...]) -> str | None:
    return None if v else "must not be empty"


def _url(schemes: tuple[str, ...], example: str) -> Rule:
    def check(v: str) -> str | None:
        if _url_fits(v, schemes):
            return None
        kinds = " or ".join(f"{s}://" for s in schemes)
        return f"must be a URL starting with {kinds}, with a host, e.g. {example}; got {v!r}"

    return check


def _url_fits(url: str, schemes: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when not a number in 0..65535
    except ValueError:
        return False
    return parts.scheme in schemes and bool(parts.hostname) and port != 0 and not parts.query


def _broker_url(v: str) -> str | None:
    return None if v == "embedded" else _url(("mqtt", "mqtts"), "mqtt://10.0.0.2:1883")(v)


def _host_port(v: str) -> str | None:
    host, sep, port = v.rpartition(":")
    if sep and host and port.isdigit() and 0 <= int(port) <= 65535:
        return None
    return f"must be host:port, e.g. 127.0.0.1:8000 ([::1]:8000 for IPv6); got {v!r}"


def _path(v: str) -> str | None:
    return None if v.startswith("/") else f"must be a path starting with '/', got {v!r}"


def _env_var(v: str) -> str | None:
    return None if _ENV_VAR.match(v) else f"must be an environment variable name, got {v!r}"


def _one_of(what: str, known: tuple[str, ...]) -> Rule:
    def check(v: str) -> str | None:
        return None if v in known else _not_one_of(what, v, known)

    return check


def _command_line(v: str) -> str | None:
    try:
        split_command(v)
    except ValueError as exc:
        return f"cannot be split into arguments: {exc}"
    return template_problem(v)


def _url_template(v: str) -> str | None:
    problem = template_problem(v)
    if problem is not None:
        return problem
    if _url_fits(fill(v, SAMPLE), ("http", "https")):
        return None
    example = "http://{node}:9000/restart/{replica}"
    kinds = "http:// or https://"
    return f"must be a URL starting with {kinds}, with a host, e.g. {example}; got {v!r}"


def _json_template(v: str) -> str | None:
    problem = template_problem(v)
    if problem is not None:
        return problem
    try:
        json.loads(fill(v, SAMPLE))
    except ValueError as exc:
        return f"must be JSON once its placeholders are filled: {exc}"
    return None


def _version(v: str) -> str | None:
    if VERSION_NAME.match(v):
        return None
    return f"must be a model name such as 'org/model-v2', got {v!r}"


def _steps(v: tuple[float, ...]) -> str | None:
    if not v:
        return "must name at least one percentage"
    if any(not 0 < p <= 100 for p in v):
        return f"each step must be > 0 and <= 100, got {list(v)}"
    if any(b <= a for a, b in itertools.pairwise(v)):
        return f"each step must be above the one before, got {list(v)}"
    return None


def _strategy(v: str) -> str | None:
    # Imported here: router.strategies imports router.replica, which imports this package.
    from router.strategies import STRATEGIES

    return None if v in STRATEGIES else _not_one_of("strategy", v, STRATEGIES)


def _not_one_of(what: str, value: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(value, known, n=1)
    if close:
        return f"unknown {what} {value!r}; did you mean {close[0]!r}?"
    return f"unknown {what} {value!r}; expected one of: {', '.join(sorted(known))}"


_RULES: dict[tuple[type, str], Rule] = {
    (FleetConfig, "cluster"): _name,
    (FleetConfig, "model"): _not_empty,
    (FleetConfig, "nodes"): _not_empty,
    (NodeConfig, "name"): _name,
    (GpuConfig, "index"): _at_least(0),
    (GpuConfig, "model"): _not_empty,
    (GpuConfig, "memory_gib"): _above(0),
    (ReplicaConfig, "id"): _name,
    (ReplicaConfig, "endpoint"): _url(("http", "https"), "http://10.0.0.5:8000"),
    (ReplicaConfig, "model"): _not_empty,
    (ReplicaConfig, "gpus"): _not_empty,
    (ReplicaConfig, "weight"): _both(_above(0), _within(MIN_WEIGHT, MAX_WEIGHT)),
    (ReplicaConfig, "batch_size"): _both(_at_least(1), _within(1, MAX_BATCH_SIZE)),
    (ReplicaConfig, "tier"): _name,
    (ReplicaConfig, "max_context_tokens"): _at_least(1),
    (ReplicaConfig, "kv_capacity_tokens"): _at_least(1),
    (ReplicaConfig, "version"): _version,
    (StrategyConfig, "name"): _strategy,
    (QueueConfig, "size"): _at_least(1),
    (QueueConfig, "default_deadline_s"): _above(0),
    (QueueConfig, "retry_after_max_s"): _at_least(1),
    (RetryConfig, "attempts"): _at_least(1),
    (RetryConfig, "backoff_s"): _at_least(0),
    (RetryConfig, "backoff_max_s"): _at_least(0),
    (TimeoutConfig, "connect_s"): _above(0),
    (TimeoutConfig, "first_byte_s"): _above(0),
    (TimeoutConfig, "total_s"): _above(0),
    (CostConfig, "prompt_factor"): _at_least(0),
    (CostConfig, "default_max_tokens"): _at_least(1),
    (AdaptiveConfig, "interval_s"): _above(0),
    (AdaptiveConfig, "weight_damping"): lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
    (AdaptiveConfig, "weight_bounds"): _bounds(0, strict=True),
    (AdaptiveConfig, "ttft_target_s"): _above(0),
    (AdaptiveConfig, "decrease"): lambda v: None if 0 < v < 1 else "must be in (0, 1)",
    (AdaptiveConfig, "hysteresis"): _at_least(2),
    (AdaptiveConfig, "batch_bounds"): _both(
        _bounds(1, strict=False), _largest_at_most(MAX_BATCH_SIZE)
    ),
    (RouterConfig, "decision_log_size"): _at_least(0),
    (RouterConfig, "slow_start_s"): _at_least(0),
    (BrokerConfig, "url"): _broker_url,
    (BrokerConfig, "username"): _not_empty,
    (BrokerConfig, "password_env"): _env_var,
    (BrokerConfig, "sample_period_s"): _above(0),
    (BrokerConfig, "ca_file"): _not_empty,
    (BrokerConfig, "cert_file"): _not_empty,
    (BrokerConfig, "key_file"): _not_empty,
    (BrokerConfig, "keepalive_s"): _at_least(1),
    (BrokerConfig, "max_payload_bytes"): _at_least(256),
    (ControlConfig, "secret_env"): _env_var,
    (ControlConfig, "max_clock_skew_s"): lambda v: (
        None if 0 < v <= 3600 else f"must be > 0 and <= 3600 (an hour), got {v!r}"
    ),
    (ControlConfig, "state_file"): _not_empty,
    (HealthConfig, "check_interval_s"): _at_least(0),
    (HealthConfig, "check_path"): _path,
    (HealthConfig, "check_timeout_s"): _above(0),
    (HealthConfig, "eject_after_failures"): _at_least(0),
    (HealthConfig, "eject_base_s"): _above(0),
    (HealthConfig, "eject_max_s"): _above(0),
    (HealthConfig, "max_ejection_percent"): _percent,
    (HealthConfig, "panic_threshold_percent"): _percent,
    (HealthConfig, "stream_idle_max_s"): _at_least(0),
    (HealthConfig, "engine_metrics_interval_s"): _at_least(0),
    (HealthConfig, "models_interval_s"): _at_least(0),
    (ServerConfig, "listen"): _host_port,
    (ServerConfig, "admin_listen"): _host_port,
    (ServerConfig, "admin_token_env"): _env_var,
    (ServerConfig, "max_body_bytes"): _at_least(1024),
    (ServerConfig, "shutdown_grace_s"): _at_least(0),
    (ServerConfig, "upstream_connections"): _at_least(1),
    (ServerConfig, "keepalive_s"): _above(0),
    (ServerConfig, "client_keepalive_s"): _at_least(1),
    (ServerConfig, "max_connections"): _at_least(0),
    (ServerConfig, "max_request_line_bytes"): _at_least(0),
    (ServerConfig, "max_header_bytes"): _at_least(1024),
    (ServerConfig, "max_headers"): _at_least(0),
    (ServerConfig, "header_timeout_s"): _at_least(0),
    (ServerConfig, "body_timeout_s"): _at_least(0),
    (ConsoleConfig, "theme"): _name,
    (ConsoleConfig, "refresh_s"): _above(0),
    (RolloutConfig, "floor"): lambda v: None if 0 < v < 1 else f"must be > 0 and < 1, got {v!r}",
    (RolloutConfig, "order"): _one_of("order", ("weakest-first", "strongest-first")),
    (RolloutConfig, "drain_timeout_s"): _above(0),
    (RolloutConfig, "on_drain_timeout"): _one_of("choice", ("wait", "preempt")),
    (RolloutConfig, "ready_timeout_s"): _above(0),
    (RolloutConfig, "check_interval_s"): _above(0),
    (RolloutConfig, "load_estimate_s"): _at_least(0),
    (RolloutConfig, "green"): _version,
    (CanaryConfig, "steps"): _steps,
    (CanaryConfig, "dwell_s"): _at_least(0),
    (CanaryConfig, "window_s"): _above(0),
    (CanaryConfig, "min_requests"): _at_least(1),
    (CanaryConfig, "max_error_rate_increase"): _within(0, 1),
    (CanaryConfig, "max_ttft_ratio"): _above(1),
    (CanaryConfig, "check_interval_s"): _above(0),
    (CommandUpdaterConfig, "run"): _command_line,
    (CommandUpdaterConfig, "timeout_s"): _above(0),
    (HttpUpdaterConfig, "url"): _url_template,
    (HttpUpdaterConfig, "method"): _one_of("method", ("GET", "POST", "PUT", "PATCH", "DELETE")),
    (HttpUpdaterConfig, "body"): _json_template,
    (HttpUpdaterConfig, "expect_status"): _within(100, 599),
    (HttpUpdaterConfig, "timeout_s"): _above(0),
}

_DERIVED: dict[tuple[type, str], str] = {
    (ReplicaConfig, "node"): "is taken from the enclosing node; remove it",
    (ReplicaConfig, "gpu_model"): "is derived from the replica's GPUs; remove it",
    (FleetConfig, "source"): "is set to the file's path; remove it",
}

_INHERITED = frozenset({(ReplicaConfig, "model")})
"""Fields a file may leave out, filled from an enclosing object in ``_complete``."""

_MOVED: dict[tuple[type, str], str] = {
    (BrokerConfig, "cluster"): "cluster is set at the top of the file",
}
"""Keys that are not fields, with a hint to where their setting lives."""


# --- conversion driven by the dataclasses -------------------------------------------------


class _Invalid:
    """Stands in for a value that had a problem, so checking can go on around it."""

    def __repr__(self) -> str:
        return "<invalid>"


_BAD: Any = _Invalid()


def _ok(*values: Any) -> bool:
    return all(v is not _BAD for v in values)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_SCALARS: dict[type, tuple[str, Callable[[Any], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", _is_number),
    str: ("a string", lambda v: isinstance(v, str)),
}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


class _Reader:
    """Converts one parsed file, noting each problem instead of stopping at the first."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self.lines: dict[str, int] = {}
        """Dotted key -> line, for every key and list item seen."""

    def line_of(self, path: str) -> int | None:
        """The key's own line, or for a key that is absent the line of what encloses it."""
        while path not in self.lines and path:
            path = _parent(path)
        return self.lines.get(path)

    def problem(self, path: str, message: str, line: int | None = None) -> None:
        """Note a problem at ``line``, by default the line of ``path`` (see line_of)."""
        where = self.line_of(path) if line is None else line
        self.problems.append(Problem(self.source, where, path or FILE_KEY, message))

    def convert(self, value: Any, hint: Any, path: str) -> Any:
        """``value`` as ``hint`` says, or ``_BAD`` after noting why it cannot be."""
        if dataclasses.is_dataclass(hint):
            return self.record(typing.cast(type, hint), value, path)
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (types.UnionType, typing.Union):  # only ever `X | None` in the schema
            (inner,) = (a for a in args if a is not type(None))
            return None if value is None else self.convert(value, inner, path)
        if origin is tuple:
            return self.sequence(value, args, path)
        if origin is Mapping:
            return self.free_mapping(value, path)
        expected, accepts = _SCALARS[hint]
        if accepts(value):
            return float(value) if hint is float else value
        scalar = not isinstance(value, dict | list) and value is not None
        quote = " (quote it to make it text)" if hint is str and scalar else ""
        self.problem(path, f"expected {expected}, got {_describe(value)}{quote}")
        return _BAD

    def record(self, cls: type[_T], value: Any, path: str) -> _T:
        """An instance of dataclass ``cls``; problem fields hold ``_BAD``."""
        if not isinstance(value, LineMap):
            self.problem(path, f"expected a mapping, got {_describe(value)}")
            return typing.cast(_T, _BAD)
        self.lines.setdefault(path, value.line)
        self.lines.update({_join(path, key): line for key, line in value.key_lines.items()})
        for duplicate in value.duplicates:
            where = _join(path, duplicate.key)
            self.problem(where, f"given twice (first at line {duplicate.first_line})")
        fields = {f.name: f for f in dataclasses.fields(typing.cast(Any, cls))}
        allowed = [name for name in fields if (cls, name) not in _DERIVED]
        values: dict[str, Any] = {n: None for n in fields if _filled_later(cls, n, value)}
        for key, item in value.items():
            key_path = _join(path, key)
            if not isinstance(key, str):
                self.problem(key_path, f"a key must be a string, got {_describe(key)}")
            elif not path and key.startswith(_EXTENSION):
                continue
            elif (cls, key) in _DERIVED:
                self.problem(key_path, _DERIVED[cls, key])
            elif (cls, key) in _MOVED:
                self.problem(key_path, f"unknown key {key!r}; {_MOVED[cls, key]}")
            elif key not in fields:
                self.problem(key_path, _not_one_of("key", key, allowed))
            else:
                values[key] = self._field(cls, key, item, key_path)
        for name, f in fields.items():
            if name not in values and f.default is f.default_factory is dataclasses.MISSING:
                self.problem(_join(path, name), f"missing required key {name!r}")
                values[name] = _BAD
        return cls(**values)

    def _field(self, cls: type, name: str, value: Any, path: str) -> Any:
        converted = self.convert(value, _hints(cls)[name], path)
        rule = _RULES.get((cls, name))
        if rule is None or converted is None or converted is _BAD:
            return converted
        message = rule(converted)
        if message is None:
            return converted
        self.problem(path, message)
        return _BAD

    def sequence(self, value: Any, args: tuple[Any, ...], path: str) -> Any:
        if not isinstance(value, LineList):
            self.problem(path, f"expected a list, got {_describe(value)}")
            return _BAD
        variadic = args[-1] is Ellipsis
        if not variadic and len(value) != len(args):
            self.problem(path, f"expected a list of {len(args)} items, got {len(value)}")
            return _BAD
        hints = [args[0]] * len(value) if variadic else list(args)
        self.lines.update({f"{path}[{i}]": line for i, line in enumerate(value.item_lines)})
        items = tuple(self.convert(v, hints[i], f"{path}[{i}]") for i, v in enumerate(value))
        # A list of objects keeps its good ones (see _each) so the later checks still see them.
        return items if _ok(*items) or dataclasses.is_dataclass(args[0]) else _BAD

    def free_mapping(self, value: Any, path: str) -> Any:
        if not isinstance(value, LineMap):
            self.problem(path, f"expected a mapping, got {_describe(value)}")
            return _BAD
        for key in value:
            if not isinstance(key, str):
                self.problem(_join(path, key), f"a key must be a string, got {_describe(key)}")
        return _freeze(value)


def _filled_later(cls: type, name: str, given: Mapping[Any, Any]) -> bool:
    return (cls, name) in _DERIVED or ((cls, name) in _INHERITED and name not in given)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(item) for item in value)
    return value


# --- checks across objects, and the fields they fill --------------------------------------


def _complete(r: _Reader, fleet: FleetConfig, directory: Path) -> FleetConfig:
    """Fill derived and inherited fields, checking what spans several objects."""
    if _ok(fleet.router):
        _check_router(r, fleet.router)
        if _ok(fleet.router.strategy):
            _check_strategy(r, fleet.router.strategy)
    if _ok(fleet.rollout) and _ok(fleet.rollout.updater) and fleet.rollout.updater is not None:
        _check_updater(r, "rollout.updater", fleet.rollout.updater)
    profiles = _check_profiles(r, fleet.profiles, directory)
    nodes = tuple(_complete_node(r, p, n, fleet.model) for p, n in _each("nodes", fleet.nodes))
    _unique(r, "node name", ((f"{p}.name", n.name) for p, n in _each("nodes", fleet.nodes)))
    ids = (
        (f"{q}.id", replica.id)
        for p, node in _each("nodes", fleet.nodes)
        for q, replica in _each(f"{p}.replicas", node.replicas)
    )
    _unique(r, "replica id", ids)
    _check_green(r, fleet, nodes)
    return dataclasses.replace(fleet, nodes=nodes, profiles=profiles)


def _check_green(r: _Reader, fleet: FleetConfig, nodes: tuple[NodeConfig, ...]) -> None:
    """A green version names a standby set: some replicas, and not every one of their model."""
    green = fleet.rollout.green if _ok(fleet.rollout) else None
    if green is None or green is _BAD:
        return
    replicas = [x for n in nodes for x in n.replicas if _ok(x)]
    models = {x.model for x in replicas if x.version == green}
    if not models:
        r.problem("rollout.green", f"no replica has 'version: {green}'")
    elif len(models) > 1:
        r.problem("rollout.green", f"the green set serves several models: {sorted(models)}")
    elif all(x.version == green for x in replicas if x.model in models):
        r.problem("rollout.green", f"every replica of {next(iter(models))} is green; no blue set")


def _each(path: str, items: Any) -> Iterator[tuple[str, Any]]:
    """(dotted key, item) for each readable item of a list that may itself be unreadable."""
    if _ok(items):
        yield from ((f"{path}[{i}]", item) for i, item in enumerate(items) if _ok(item))


def _check_router(r: _Reader, router: RouterConfig) -> None:
    t = router.retries
    if _ok(t) and _ok(t.backoff_s, t.backoff_max_s) and t.backoff_max_s < t.backoff_s:
        r.problem("router.retries.backoff_max_s", "must be >= backoff_s")
    h = router.health
    if _ok(h) and _ok(h.eject_base_s, h.eject_max_s) and h.eject_max_s < h.eject_base_s:
        r.problem("router.health.eject_max_s", "must be >= eject_base_s")


def _check_updater(r: _Reader, path: str, updater: UpdaterConfig) -> None:
    given = [name for name in ("command", "http") if getattr(updater, name) is not None]
    if len(given) != 1:
        said = "both" if given else "neither"
        r.problem(path, f"needs exactly one of 'command' and 'http', got {said}")


def _check_strategy(r: _Reader, strategy: StrategyConfig) -> None:
    """Build the strategy once, so that bad parameters fail here rather than at start-up."""
    if not _ok(strategy.name, strategy.params):
        return
    # Imported here: router.strategies imports router.replica, which imports this package.
    from router.strategies import create_strategy

    try:
        create_strategy(strategy.name, strategy.params)
    except ControlError as exc:
        # A strategy given no params fails for want of one: point at the name it was given.
        path = "router.strategy.params"
        line = r.lines.get(path, r.lines.get("router.strategy.name"))
        # The key already names the strategy's params; the prefix would say so twice.
        message = str(exc).removeprefix(f"strategy {strategy.name}: ")
        r.problem(path, message, line)


def _check_profiles(r: _Reader, entries: Any, directory: Path) -> Any:
    """The profile files' paths from ``directory``, each checked by reading the catalog."""
    if not _ok(entries):
        return entries
    paths = tuple(directory / entry for entry in entries)
    found = True
    for i, (entry, path) in enumerate(zip(entries, paths, strict=True)):
        if not entry:
            r.problem(f"profiles[{i}]", "must not be empty")
            found = False
        elif not path.is_file():
            base = "" if Path(entry).is_absolute() else " (relative paths start at the fleet file)"
            r.problem(f"profiles[{i}]", f"no such file: {path}{base}")
            found = False
    # Only a full set is read: a catalog missing a file could report false alias clashes.
    if found and paths:
        try:
            load_catalog(paths)
        except ConfigError as exc:  # each problem names its own file and line
            r.problems.extend(exc.problems)
    return tuple(str(p) for p in paths)


def _unique(r: _Reader, what: str, entries: Iterable[tuple[str, Any]]) -> None:
    first: dict[Any, str] = {}
    for path, value in entries:
        if value is _BAD:
            continue
        if value in first:
            r.problem(path, f"duplicate {what} {value!r} (first at line {r.line_of(first[value])})")
        else:
            first[value] = path


def _complete_node(r: _Reader, path: str, node: NodeConfig, model: str | None) -> NodeConfig:
    gpus = list(_each(f"{path}.gpus", node.gpus))
    _unique(r, "GPU index", ((f"{p}.index", g.index) for p, g in gpus))
    # With a GPU unreadable, each reference to it would be a second, false problem.
    readable = _ok(node.gpus) and all(_ok(g) and _ok(g.index) for g in node.gpus)
    models = {g.index: g.model for _, g in reversed(gpus)} if readable else None
    users: dict[int, tuple[str, str]] = {}
    replicas = tuple(
        _complete_replica(r, p, replica, node.name, models, users, model)
        for p, replica in _each(f"{path}.replicas", node.replicas)
    )
    return dataclasses.replace(node, replicas=replicas)


def _complete_replica(
    r: _Reader,
    path: str,
    replica: ReplicaConfig,
    node: str,
    models: Mapping[int, str] | None,
    users: dict[int, tuple[str, str]],
    fleet_model: str | None,
) -> ReplicaConfig:
    model = replica.model
    if model is None:
        if fleet_model is None:
            r.problem(f"{path}.model", "missing; set it here or the fleet's top-level 'model'")
        model = fleet_model
    gpu_model = _gpu_model(r, path, replica, models, users)
    return dataclasses.replace(replica, node=node, model=model, gpu_model=gpu_model)


def _gpu_model(
    r: _Reader,
    path: str,
    replica: ReplicaConfig,
    models: Mapping[int, str] | None,
    users: dict[int, tuple[str, str]],
) -> str:
    """The one model of the replica's GPUs, noting GPUs missing, shared or mixed."""
    if models is None or replica.gpus is _BAD:
        return typing.cast(str, _BAD)
    for k, index in enumerate(replica.gpus):
        item = f"{path}.gpus[{k}]"
        if index not in models:
            known = ", ".join(str(i) for i in sorted(models)) or "none"
            r.problem(item, f"GPU {index} is not one of the node's GPUs ({known})")
        elif index in replica.gpus[:k]:
            r.problem(item, f"GPU {index} is listed twice")
        elif index in users:
            user_path, user_id = users[index]
            where = f"{user_path}, line {r.line_of(user_path)}"
            r.problem(item, f"GPU {index} is already used by replica {user_id!r} ({where})")
        else:
            users[index] = (path, replica.id)
    found = sorted({models[i] for i in replica.gpus if i in models and models[i] is not _BAD})
    if len(found) > 1:
        mixed = ", ".join(found)
        r.problem(f"{path}.gpus", f"a tensor-parallel replica needs one GPU model, not {mixed}")
    return found[0] if len(found) == 1 else typing.cast(str, _BAD)


# --- entry points -------------------------------------------------------------------------


def parse_fleet(text: str, source: str, directory: str | Path | None = None) -> FleetConfig:
    """Build a fleet from YAML text; ``source`` names it in problems. Raises ConfigError.

    Relative ``profiles:`` paths start at ``directory``, by default the current directory.
    """
    return _build(parse_yaml(text, source), source, Path(directory or "."))


def load_fleet(path: str | Path) -> FleetConfig:
    """Read and check a fleet file. Raises ConfigError listing every problem in it."""
    path = Path(path)
    fleet = _build(read_yaml(path), str(path), path.parent)
    return dataclasses.replace(fleet, source=path)


def parse_rollout_settings(
    settings: Mapping[str, Any], base: RolloutConfig, source: str = "rollout"
) -> RolloutConfig:
    """A rollout command's own settings (the keys of the fleet file's ``rollout:``), over
    ``base``; the same rules as in a fleet file, every problem at once as a ConfigError whose
    keys start with ``rollout.``."""
    # JSON is YAML: the settings go through the reader that checks fleet files.
    document = parse_yaml(json.dumps(dict(settings)), source)
    reader = _Reader(source)
    parsed = reader.record(RolloutConfig, document, "rollout")
    if parsed is not _BAD and _ok(parsed.updater) and parsed.updater is not None:
        _check_updater(reader, "rollout.updater", parsed.updater)
    if reader.problems:
        raise ConfigError([dataclasses.replace(p, line=None) for p in reader.problems])
    given = {key: getattr(parsed, key) for key in settings}
    canary = settings.get("canary")
    if isinstance(canary, Mapping):  # its keys over the base's, not over the defaults
        given["canary"] = dataclasses.replace(
            base.canary, **{key: getattr(parsed.canary, key) for key in canary}
        )
    return dataclasses.replace(base, **given)


def unprofiled_kinds(
    fleet: FleetConfig, catalog: ProfileCatalog | None = None
) -> tuple[tuple[str, str], ...]:
    """Each (model, GPU model) pair of the fleet's replicas that has no performance profile.

    Routing needs no profile; the emulator and the simulator do. ``catalog`` defaults to the
    built-in profiles and the fleet's ``profiles`` files. Pairs come in file order, once each.
    """
    if catalog is None:
        catalog = load_catalog(fleet.profiles)
    missing: dict[tuple[str, str], None] = {}
    for replica in fleet.replicas:
        try:
            catalog.gpu(replica.gpu_model)
            catalog.model(replica.model)
        except UnknownProfileError:
            missing[replica.model, replica.gpu_model] = None
    return tuple(missing)


def _build(document: Any, source: str, directory: Path) -> FleetConfig:
    reader = _Reader(source)
    if document is None:
        reader.problem("", "the file is empty; a fleet needs at least 'nodes'")
        fleet = _BAD
    else:
        fleet = reader.record(FleetConfig, document, "")
    if fleet is not _BAD:
        fleet = _complete(reader, fleet, directory)
    if reader.problems:
        # The fleet file's problems in line order, then those of the profile files it names.
        order = sorted(
            reader.problems, key=lambda p: (0, p.line or 0) if p.file == source else (1, 0)
        )
        raise ConfigError(order)
    return typing.cast(FleetConfig, fleet)
