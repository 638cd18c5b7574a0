"""The shape of an HTTP answer: what a client depends on, without the values that vary.

A JSON value becomes its skeleton: objects keep their keys, lists the distinct shapes of their
items, and a scalar becomes its type (``"<str>"``, ``"<int>"``, ``"<float>"``, ``"<bool>"``,
``"<null>"``), except under the keys in :data:`LITERAL_KEYS`, whose values clients branch on
(``object``, ``role``, ``finish_reason``, an error's ``type`` and ``code``): those are kept as
they are. A Server-Sent Events stream becomes the list of its events' shapes, a run of equal
shapes written once (a stream of 4 tokens and one of 40 have the same shape), or a line naming
the first framing fault. A Prometheus page becomes, for each ``vllm:`` family, its type, its
label names and its sample names (``_total``, ``_bucket``, ...).

:func:`differences` compares two shapes and says where they part, one line per difference.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "LITERAL_KEYS",
    "differences",
    "json_shape",
    "media_type",
    "metrics_shape",
    "sse_shape",
]

LITERAL_KEYS = frozenset({"object", "role", "finish_reason", "type", "code", "param", "owned_by"})
"""Keys whose values are part of the shape: clients compare them to constants."""

_PREFIX = "vllm:"
"""The metric families the contract covers; the rest (process, Python, HTTP) are the
exporter's, not the engine's."""

_DONE = "[DONE]"


def media_type(content_type: str | None) -> str:
    """``text/event-stream; charset=utf-8`` -> ``text/event-stream``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def json_shape(value: Any, key: str | None = None) -> Any:
    """The skeleton of a parsed JSON ``value`` found under ``key``."""
    if isinstance(value, dict):
        return {k: json_shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        shapes: list[Any] = []
        for item in value:
            shaped = json_shape(item, key)
            if shaped not in shapes:
                shapes.append(shaped)
        return shapes
    if key in LITERAL_KEYS:
        return value
    return _type_name(value)


def _type_name(value: object) -> str:
    if value is None:
        return "<null>"
    if isinstance(value, bool):
        return "<bool>"
    if isinstance(value, int):
        return "<int>"
    if isinstance(value, float):
        return "<float>"
    return "<str>"


def sse_shape(raw: str) -> list[Any] | str:
    """The shapes of a stream's events, runs collapsed; a string naming a framing fault."""
    if not raw.endswith("\n\n"):
        return "framing: the stream does not end with a blank line"
    shapes: list[Any] = []
    for i, event in enumerate(raw[:-2].split("\n\n")):
        if not event.startswith("data: ") or "\n" in event:
            return f"framing: event {i} is not one 'data: ' line: {event[:60]!r}"
        payload = event[len("data: ") :]
        shaped = payload if payload == _DONE else _event_shape(payload, i)
        if not shapes or shapes[-1] != shaped:
            shapes.append(shaped)
    if shapes[-1] != _DONE:
        return "framing: the last event is not [DONE]"
    return shapes


def _event_shape(payload: str, i: int) -> Any:
    try:
        return json_shape(json.loads(payload))
    except ValueError:
        return f"framing: event {i} is not JSON: {payload[:60]!r}"


def metrics_shape(text: str) -> dict[str, Any]:
    """``{family: {"type", "labels", "samples"}}`` for every ``vllm:`` family of a page."""
    families: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(_PREFIX):
            continue
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        families[family.name] = {
            "type": family.type,
            "labels": sorted(labels),
            "samples": sorted({s.name for s in family.samples}),
        }
    return dict(sorted(families.items()))


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected``, one line per difference (none: equal)."""
    where = path or "the answer"
    if isinstance(expected, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in expected.keys() - actual.keys():
            out.append(f"{where}: missing key {key!r} (expected {_brief(expected[key])})")
        for key in actual.keys() - expected.keys():
            out.append(f"{where}: unexpected key {key!r} ({_brief(actual[key])})")
        for key in sorted(expected.keys() & actual.keys()):
            out.extend(differences(expected[key], actual[key], f"{path}.{key}" if path else key))
        return sorted(out)
    if isinstance(expected, list) and isinstance(actual, list):
        return _list_differences(expected, actual, path)
    if expected != actual:
        return [f"{where}: expected {_brief(expected)}, got {_brief(actual)}"]
    return []


def _list_differences(expected: list[Any], actual: list[Any], path: str) -> list[str]:
    out: list[str] = []
    for i in range(max(len(expected), len(actual))):
        at = f"{path}[{i}]"
        if i >= len(actual):
            out.append(f"{at}: missing item (expected {_brief(expected[i])})")
        elif i >= len(expected):
            out.append(f"{at}: unexpected item ({_brief(actual[i])})")
        else:
            out.extend(differences(expected[i], actual[i], at))
    return out


def _brief(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
