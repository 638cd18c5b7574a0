"""A rollout's preview and progress, typed, from the one JSON shape both backends give.

The in-process backend reads the router's :class:`~router.rollout.manager.RolloutManager`
(``status()`` and ``preview()`` return dicts) and the attached one reads ``/admin/rollout``,
which answers the same dicts as JSON: :func:`preview_from_json` and :func:`progress_from_json`
are the one conversion, and a shape they do not expect is a ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GOING",
    "STEERING",
    "Figures",
    "ReplicaProgress",
    "RolloutPreview",
    "RolloutProgress",
    "Wave",
    "preview_from_json",
    "progress_from_json",
]

GOING = frozenset({"running", "paused", "rolling back"})
"""Phases of a rollout not yet ended: another cannot start."""
STEERING = ("pause", "resume", "abort", "rollback")
"""What an operator may ask of the rollout going (or, for rollback, the last one)."""


@dataclass(frozen=True, slots=True)
class Wave:
    replicas: tuple[str, ...]
    remaining: float
    """Share of the fleet's capacity left in service while this wave is out."""


@dataclass(frozen=True, slots=True)
class Figures:
    """A rollout's cost to the traffic, as the simulator predicts it or as the router measured
    it (issue 16, point 5)."""

    capacity_lowest: float
    """The lowest share of capacity in service."""
    peak_queue: int
    """The most requests waiting in the router's queue at once."""
    ttft_p99_s: float | None
    """p99 TTFT of the requests that arrived during it (None: none did, or not bounded)."""
    duration_s: float | None
    """From the start to the last replica back (None: not ended)."""


@dataclass(frozen=True, slots=True)
class RolloutPreview:
    """What a start would do now: the plan and the settings in force, nothing started."""

    version: str
    waves: tuple[Wave, ...]
    floor: float
    shares: Mapping[str, float]
    """Each replica's share of the fleet's learned capacity."""
    settings: Mapping[str, Any]
    """The settings in force: the form's over the fleet file's ``rollout:`` section."""
    prediction: Figures | None = None
    """None where nothing predicts: the confirmation then shows no figure at all."""
    prediction_error: str | None = None
    """Why there is no prediction (the simulator cannot run this fleet), when the router says."""


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    replica: str
    wave: int
    """1-based."""
    step: str
    version: str


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """One rollout's state, as ``GET /admin/rollout`` says it (docs/rollouts.md)."""

    id: str
    version: str
    phase: str
    waves: tuple[Wave, ...]
    floor: float
    wave: int | None
    """0-based index of the wave under way or last done; None before the first."""
    replicas: tuple[ReplicaProgress, ...]
    capacity_now: float
    capacity_lowest: float
    requests_moved: int
    waited_for: int
    error: str | None
    prediction: Figures | None = None
    """What the simulator predicted when it started (None until worked out, or if it failed)."""
    measured: Figures | None = None
    """The same figures as the router measured them."""

    @property
    def going(self) -> bool:
        return self.phase in GOING


def _waves(plan: Mapping[str, Any]) -> tuple[Wave, ...]:
    return tuple(
        Wave(tuple(str(r) for r in w["replicas"]), float(w["remaining"])) for w in plan["waves"]
    )


def _figures(data: object) -> Figures | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ValueError("prediction: expected a JSON object")
    return Figures(
        float(data["capacity_lowest"]),
        int(data["peak_queue"]),
        _seconds(data.get("ttft_p99_s")),
        _seconds(data.get("duration_s")),
    )


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    raise TypeError(f"seconds: expected a number, got {value!r}")


def preview_from_json(data: Mapping[str, Any]) -> RolloutPreview:
    """A preview (``{"action": "preview"}``'s ``preview``); ValueError when it is not one."""
    try:
        plan = data["plan"]
        return RolloutPreview(
            version=str(data["version"]),
            waves=_waves(plan),
            floor=float(plan["floor"]),
            shares={str(k): float(v) for k, v in data["shares"].items()},
            settings=dict(data["settings"]),
            prediction=_figures(data.get("prediction")),
            prediction_error=_text(data.get("prediction_error")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a rollout preview: {exc!r}") from None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def progress_from_json(data: Mapping[str, Any]) -> RolloutProgress:
    """A rollout's status; ValueError when it is not one."""
    try:
        plan = data["plan"]
        waves = _waves(plan)
        wave_of = {r: i + 1 for i, w in enumerate(waves) for r in w.replicas}
        steps, versions = data["steps"], data["versions"]
        replicas = tuple(
            ReplicaProgress(r, wave_of[r], str(steps[r]), str(versions[r])) for r in plan["order"]
        )
        wave = data["wave"]
        error = data["error"]
        return RolloutProgress(
            id=str(data["id"]),
            version=str(data["version"]),
            phase=str(data["phase"]),
            waves=waves,
            floor=float(plan["floor"]),
            wave=None if wave is None else int(wave),
            replicas=replicas,
            capacity_now=float(data["capacity_now"]),
            capacity_lowest=float(data["capacity_lowest"]),
            requests_moved=int(data["requests_moved"]),
            waited_for=int(data["waited_for"]),
            error=None if error is None else str(error),
            prediction=_figures(data.get("prediction")),
            measured=_figures(data.get("measured")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a rollout's status: {exc!r}") from None
