"""The admin API's JSON back into the router's own types, by their type hints.

The admin API writes ``dataclasses.asdict`` of frozen dataclasses (the fleet snapshot, the
telemetry status, audit events, routing decisions); :func:`rebuild` reads them back, so an
attached console feeds its views the very types the console in the router's process gets.
Keys it does not know are skipped (a newer router may say more); a missing field without a
default, or a value of the wrong kind, is a :class:`ValueError` naming where it is.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

__all__ = ["rebuild"]

T = TypeVar("T")


def rebuild(cls: type[T], data: object) -> T:
    """``data`` (JSON as parsed) as an instance of the dataclass ``cls``."""
    return typing.cast(T, _value(cls, data, cls.__name__))


def _value(hint: Any, data: object, where: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Any:
        return data
    if origin in (types.UnionType, typing.Union):
        return _union(typing.get_args(hint), data, where)
    if origin is typing.Literal:
        if data not in typing.get_args(hint):
            raise ValueError(f"{where}: {data!r} is not one of {typing.get_args(hint)}")
        return data
    if origin is tuple:
        return _tuple(typing.get_args(hint), data, where)
    if origin in (dict, Mapping):
        _, value_hint = typing.get_args(hint)
        mapping = _expect(data, dict, where)
        return {k: _value(value_hint, v, f"{where}.{k}") for k, v in mapping.items()}
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass(hint, data, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(data)
        except ValueError:
            raise ValueError(f"{where}: {data!r} is not a {hint.__name__}") from None
    return _scalar(hint, data, where)


def _dataclass(cls: type, data: object, where: str) -> Any:
    mapping = _expect(data, dict, where)
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in mapping:
            kwargs[f.name] = _value(hints[f.name], mapping[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"{where}: `{f.name}` is missing")
    return cls(**kwargs)


def _union(arms: tuple[Any, ...], data: object, where: str) -> Any:
    if data is None and type(None) in arms:
        return None
    problems = []
    for arm in arms:
        if arm is type(None):
            continue
        try:
            return _value(arm, data, where)
        except ValueError as exc:
            problems.append(str(exc))
    raise ValueError("; ".join(problems) or f"{where}: {data!r} fits none of {arms}")


def _tuple(items: tuple[Any, ...], data: object, where: str) -> tuple[Any, ...]:
    values = _expect(data, list, where)
    if len(items) == 2 and items[1] is Ellipsis:
        return tuple(_value(items[0], v, f"{where}[{i}]") for i, v in enumerate(values))
    if len(items) != len(values):
        raise ValueError(f"{where}: {len(values)} items where {len(items)} were expected")
    pairs = enumerate(zip(items, values, strict=True))
    return tuple(_value(h, v, f"{where}[{i}]") for i, (h, v) in pairs)


def _scalar(hint: Any, data: object, where: str) -> Any:
    if hint is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)  # JSON writes 2.0 as 2
    # bool is an int to Python, not to JSON: a flag where a count is expected is wrong.
    if hint is int and isinstance(data, bool):
        raise ValueError(f"{where}: {data!r} is not an int")
    if isinstance(hint, type) and isinstance(data, hint):
        return data
    name = getattr(hint, "__name__", str(hint))
    raise ValueError(f"{where}: {data!r} is not a {name}")


def _expect(data: object, kind: type[T], where: str) -> T:
    if not isinstance(data, kind):
        raise ValueError(f"{where}: expected a JSON {'object' if kind is dict else 'array'}")
    return data


@cache
def _hints(cls: type) -> dict[str, Any]:
    # The modules use ``from __future__ import annotations``: hints are strings until resolved.
    return typing.get_type_hints(cls)
