"""Faults an emulated replica can be told to show, and the commands that set them.

- ``kill``: the server dies: it stops listening and drops every open connection; the port
  refuses until ``revive``.
- ``hang``: connections are accepted and requests read, but nothing is answered (not even
  ``/health``) until ``heal``.
- ``slow``: every engine step takes ``factor`` times as long.
- ``fail``: a ``fraction`` of completion requests answer 500, drawn from a seeded generator.
  ``slow`` and ``fail`` stand for the card or the version and outlast a restart; given a
  ``version`` they stand for that version's build and act only while the replica serves it
  (a canary's bad version: gone once it is rolled back, back if it is loaded again).
- ``refuse``: the listener closes; connections already open carry on.
- ``freeze``: the engine stops stepping while the server answers on: ``/health``, ``/v1/models``
  and ``/metrics`` as usual, requests accepted (streams get their headers) but no token comes
  out and nothing new is admitted, until ``thaw``. What a vLLM whose engine core is stopped
  (a hung GPU, a stuck collective) looks like from outside.
- ``thaw``: the engine steps again; the streams it held carry on where they stood.
- ``heal`` (or ``revive``): all of it undone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from router.errors import ControlError
from router.rollout.templates import VERSION_NAME

__all__ = ["FaultCommand", "FaultName", "FaultState", "parse_fault_command"]

FaultName = Literal["kill", "hang", "slow", "fail", "refuse", "freeze", "thaw", "heal", "revive"]
_NAMES: tuple[str, ...] = get_args(FaultName)


@dataclass(slots=True)
class FaultState:
    """What is wrong with one replica now."""

    killed: bool = False
    refusing: bool = False
    hung: bool = False
    frozen: bool = False
    slow_factor: float = 1.0
    fail_fraction: float = 0.0
    of_version: str | None = None
    """The version ``slow`` and ``fail`` were set for (they act only while it is served);
    None: for the card, whatever runs."""

    @property
    def listening(self) -> bool:
        return not (self.killed or self.refusing)

    @property
    def healthy(self) -> bool:
        return self == FaultState()

    def as_json(self) -> dict[str, Any]:
        return {
            "killed": self.killed,
            "refusing": self.refusing,
            "hung": self.hung,
            "frozen": self.frozen,
            "slow_factor": self.slow_factor,
            "fail_fraction": self.fail_fraction,
            "of_version": self.of_version,
        }


@dataclass(frozen=True, slots=True)
class FaultCommand:
    """One fault to set, as the control listener receives it."""

    fault: FaultName
    factor: float = 1.0
    """``slow``: how many times longer each step takes (> 0)."""
    fraction: float = 0.0
    """``fail``: the share of requests that answer 500 (0..1)."""
    seed: int | None = None
    """``fail``: seed of the draws; None means the fleet's seed."""
    version: str | None = None
    """``slow``, ``fail``: the version they stand for (they act only while the replica serves
    it); None: whatever it serves."""


def parse_fault_command(body: object) -> FaultCommand:
    """``{"fault": ..., "factor": ..., "fraction": ..., "seed": ...}``; ControlError if wrong."""
    if not isinstance(body, dict):
        raise ControlError("expected a JSON object with a 'fault'")
    fault = body.get("fault")
    if fault not in _NAMES:
        raise ControlError(f"'fault' must be one of {', '.join(_NAMES)}; got {fault!r}")
    factor = _number(body, "factor", 1.0)
    fraction = _number(body, "fraction", 0.0)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ControlError("'seed' must be an integer")
    version = body.get("version")
    if version is not None:
        if fault not in ("slow", "fail"):
            raise ControlError("only 'slow' and 'fail' take a 'version'")
        if not isinstance(version, str) or not VERSION_NAME.match(version):
            raise ControlError(f"'version' must be a model name, got {version!r}")
    command = FaultCommand(fault, factor, fraction, seed, version)
    check_fault_values(command.factor, command.fraction)
    return command


def check_fault_values(factor: float, fraction: float) -> None:
    """ControlError unless ``factor > 0`` and ``0 <= fraction <= 1``."""
    if not factor > 0:
        raise ControlError(f"'factor' must be > 0, got {factor}")
    if not 0 <= fraction <= 1:
        raise ControlError(f"'fraction' must be between 0 and 1, got {fraction}")


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ControlError(f"'{key}' must be a finite number")
    return float(value)
