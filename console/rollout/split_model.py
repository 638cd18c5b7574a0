"""A traffic split (a canary, or the fleet file's blue-green set), typed, from the one JSON
shape both backends give.

The in-process backend reads the router's :class:`~router.rollout.splits.Splits` (``status()``
returns a dict) and the attached one reads ``GET /admin/split`` (``{"split": ...}``), the same
dict as JSON: :func:`split_from_json` is the one conversion, and a shape it does not expect is
a ValueError (docs/rollouts.md, "Canary" and "Blue-green").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CANARY_GOING",
    "BlueGreenState",
    "CanaryState",
    "SetMember",
    "SplitState",
    "VersionFigures",
    "split_from_json",
]

CANARY_GOING = frozenset({"preparing", "running", "promoting"})
"""Phases of a canary not yet ended: another cannot start."""


@dataclass(frozen=True, slots=True)
class VersionFigures:
    """One version's finished attempts over the judge's window."""

    requests: int
    errors: int
    error_rate: float
    p99_ttft_s: float | None
    """None: no attempt went well."""


@dataclass(frozen=True, slots=True)
class CanaryState:
    """A canary as ``GET /admin/split`` says it."""

    id: str
    model: str
    """The stable name both versions serve."""
    old: str
    new: str
    replicas: tuple[str, ...]
    phase: str
    share: float
    """The new version's share now, 0..1."""
    auto: bool
    """Steps on its own; False: the operator moves the share."""
    steps: tuple[float, ...]
    """The schedule, shares 0..1."""
    step: int | None
    """0-based index of the step it is at; None before the first (or stepped by hand)."""
    new_figures: VersionFigures
    old_figures: VersionFigures
    verdict: str | None
    """Why it was rolled back, with both versions' figures; None while nothing was judged."""
    judged: tuple[VersionFigures, VersionFigures] | None
    """(new, old): the figures the verdict was taken on."""
    rollout: str | None
    """The rollout that moved its replicas (``v`` shows it)."""
    error: str | None

    @property
    def going(self) -> bool:
        return self.phase in CANARY_GOING


@dataclass(frozen=True, slots=True)
class SetMember:
    """A replica of a blue-green set."""

    replica: str
    state: str
    version: str
    in_flight: int


@dataclass(frozen=True, slots=True)
class BlueGreenState:
    """The fleet file's blue-green set as ``GET /admin/split`` says it."""

    id: str
    model: str
    old: str
    """The blue set's version."""
    new: str
    """The green set's version."""
    phase: str
    """``blue``, ``switched`` or ``released``."""
    share: float
    """Green's share now, 0..1."""
    blue: tuple[SetMember, ...]
    green: tuple[SetMember, ...]
    in_flight: int
    """Requests still running on the blue set."""
    emptied: bool
    """The blue set has held nothing since the switch."""


SplitState = CanaryState | BlueGreenState


def split_from_json(data: Mapping[str, Any]) -> SplitState:
    """A split's state (``{"split": ...}``'s value); ValueError when it is not one."""
    try:
        if data["kind"] == "canary":
            return _canary(data)
        if data["kind"] == "blue-green":
            return _blue_green(data)
        raise ValueError(f"unknown kind {data['kind']!r}")
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a traffic split's state: {exc!r}") from None


def _canary(data: Mapping[str, Any]) -> CanaryState:
    figures, judged = data["figures"], data["judged"]
    step = data["step"]
    return CanaryState(
        id=str(data["id"]),
        model=str(data["model"]),
        old=str(data["old"]),
        new=str(data["new"]),
        replicas=tuple(str(r) for r in data["replicas"]),
        phase=str(data["phase"]),
        share=float(data["share"]),
        auto=bool(data["auto"]),
        steps=tuple(float(s) for s in data["steps"]),
        step=None if step is None else int(step),
        new_figures=_figures(figures["new"]),
        old_figures=_figures(figures["old"]),
        verdict=_text(data["verdict"]),
        judged=None if judged is None else (_figures(judged["new"]), _figures(judged["old"])),
        rollout=_text(data["rollout"]),
        error=_text(data["error"]),
    )


def _blue_green(data: Mapping[str, Any]) -> BlueGreenState:
    return BlueGreenState(
        id=str(data["id"]),
        model=str(data["model"]),
        old=str(data["old"]),
        new=str(data["new"]),
        phase=str(data["phase"]),
        share=float(data["share"]),
        blue=_members(data["blue"]),
        green=_members(data["green"]),
        in_flight=int(data["in_flight"]),
        emptied=bool(data["emptied"]),
    )


def _members(data: Mapping[str, Any]) -> tuple[SetMember, ...]:
    return tuple(
        SetMember(str(rid), str(r["state"]), str(r["version"]), int(r["in_flight"]))
        for rid, r in data.items()
    )


def _figures(data: Mapping[str, Any]) -> VersionFigures:
    p99 = data["p99_ttft_s"]
    return VersionFigures(
        int(data["requests"]),
        int(data["errors"]),
        float(data["error_rate"]),
        None if p99 is None else float(p99),
    )


def _text(value: object) -> str | None:
    return None if value is None else str(value)
