"""A scenario step that starts a model rollout (docs/rollouts.md), checked when it is read.

``- {at: 20, rollout: {version: llama-v2, floor: 0.75, updater: emulator}}``: the mapping takes
the version and the keys of a fleet file's ``rollout:`` section, which default to that
section's. ``updater: emulator`` (or ``{emulator: {load_s: 5}}``) restarts each emulated
replica through the emulator's version switch, serving the new version under the fleet's
model name as well, so the clients' requests keep being routed all through the rollout.

The plan is tried at load on the fleet file's static weights, so a floor that no plan can
keep is refused with the file, line and key; live, the router plans again from its learned
capacity when the step runs, and may still refuse (the action then fails the run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from router.config.loader import parse_rollout_settings
from router.config.schema import FleetConfig
from router.errors import ConfigError, RolloutError
from router.rollout.plan import Member, Order, plan_waves
from router.rollout.templates import VERSION_NAME
from router.yaml_lines import LineMap

__all__ = ["ROLLOUT_KEYS", "EmulatorUpdater", "RolloutStep", "read_rollout_step"]

ROLLOUT_KEYS = (
    "version",
    "floor",
    "order",
    "drain_timeout_s",
    "on_drain_timeout",
    "ready_timeout_s",
    "check_interval_s",
    "load_estimate_s",
    "updater",
)
_TIMES = ("drain_timeout_s", "ready_timeout_s", "check_interval_s", "load_estimate_s")
"""Settings in scenario seconds: shortened by the time scale live, as the router's timers are."""

Problem = tuple[int | None, str, str]
"""(line, key under the step, message)."""


@dataclass(frozen=True, slots=True)
class EmulatorUpdater:
    """Restart each replica through the live run's emulator (its ``POST /versions/<id>``)."""

    load_s: float | None = None
    """Emulated seconds each restart takes to load (the emulator scales them like its engine
    steps); None: the emulator's own default (router/emulator/versions.py)."""


@dataclass(frozen=True, slots=True)
class RolloutStep:
    version: str
    settings: Mapping[str, Any]
    """The rollout command's own settings (the fleet file's ``rollout:`` keys), as the admin
    API takes them; without ``updater`` when ``emulator`` is set."""
    emulator: EmulatorUpdater | None = None

    def describe(self) -> str:
        how = "emulator" if self.emulator is not None else "updater"
        floor = self.settings.get("floor")
        return (
            f"rollout {self.version}"
            + (f" floor={floor}" if floor is not None else "")
            + (f" via {how}")
        )

    def live_settings(
        self, control_url: str, stable_name: str, time_scale: float
    ) -> dict[str, Any]:
        """The settings a live run starts it with: times in wall seconds, and the emulator's
        version switch as an HTTP updater when ``updater: emulator``."""
        out = {k: (v / time_scale if k in _TIMES else v) for k, v in self.settings.items()}
        if self.emulator is not None:
            # The stable name as an alias: clients keep asking for it, and it must reach old
            # and new replicas alike (docs/rollouts.md).
            body: dict[str, Any] = {"version": "{version}", "aliases": [stable_name]}
            if self.emulator.load_s is not None:
                body["load_s"] = self.emulator.load_s
            # The prediction counts the switch's own load time (wall seconds, as the rest).
            from router.emulator.versions import DEFAULT_LOAD_S  # a live run has the emulator

            load_s = DEFAULT_LOAD_S if self.emulator.load_s is None else self.emulator.load_s
            out["load_estimate_s"] = load_s / time_scale
            out["updater"] = {
                "http": {
                    "url": f"{control_url}/versions/{{replica}}",
                    "body": json.dumps(body),
                    "expect_status": 202,
                }
            }
        return out


def read_rollout_step(
    m: LineMap,
    fleet: FleetConfig | None,
    emulated: bool,
    *,
    own: tuple[str, ...] = (),
    plan: bool = True,
) -> tuple[RolloutStep | None, list[Problem]]:
    """The step written as mapping ``m``; every problem found, each with its line and key.
    ``own``: more keys the caller reads itself (a canary's); ``plan``: try the plan of the
    whole fleet on its static weights."""
    problems: list[Problem] = []
    known = (*ROLLOUT_KEYS, *own)
    for key, line in m.key_lines.items():
        if key not in known:
            problems.append((line, str(key), _unknown_key(str(key), known)))
    version = m.get("version")
    if "version" not in m:
        problems.append((m.line, "version", "missing required key 'version'"))
    elif not isinstance(version, str) or not VERSION_NAME.match(version):
        message = f"must be a model name such as org/model-v2, got {version!r}"
        problems.append((m.key_lines["version"], "version", message))
    # A canary's own rules (``canary:``) are a key of the ``rollout:`` section as well.
    taken = (*ROLLOUT_KEYS, *(k for k in own if k == "canary"))
    settings = {k: _plain(v) for k, v in m.items() if k in taken and k != "version"}
    names_emulator = _names_emulator(settings.get("updater"))
    emulator = _emulator(m, settings, emulated, problems)
    if fleet is not None:
        _check_settings(m, settings, fleet, names_emulator, problems, plan)
    if problems or not isinstance(version, str):
        return None, problems
    return RolloutStep(version, MappingProxyType(settings), emulator), problems


def _unknown_key(key: str, known: tuple[str, ...]) -> str:
    import difflib

    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"expected one of: {', '.join(known)}"
    return f"unknown key {key!r}; {hint}"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _names_emulator(updater: Any) -> bool:
    return updater == "emulator" or (isinstance(updater, dict) and "emulator" in updater)


def _emulator(
    m: LineMap, settings: dict[str, Any], emulated: bool, problems: list[Problem]
) -> EmulatorUpdater | None:
    """``updater: emulator`` or ``{emulator: {load_s: N}}``, taken out of ``settings``."""
    raw = settings.get("updater")
    if raw == "emulator":
        step: EmulatorUpdater | None = EmulatorUpdater()
    elif isinstance(raw, dict) and "emulator" in raw:
        step = _emulator_options(m, raw, problems)
    else:
        return None
    del settings["updater"]
    if not emulated:
        message = "the emulator updater needs an emulated fleet (fleet.emulated: true)"
        problems.append((m.key_lines["updater"], "updater", message))
    return step


def _emulator_options(
    m: LineMap, raw: dict[str, Any], problems: list[Problem]
) -> EmulatorUpdater | None:
    line = m.key_lines["updater"]
    options = raw["emulator"]
    extra = sorted(set(raw) - {"emulator"})
    if extra:
        problems.append(
            (line, f"updater.{extra[0]}", "give one updater: emulator, command or http")
        )
    if options is None:
        return EmulatorUpdater()
    if not isinstance(options, dict) or set(options) - {"load_s"}:
        problems.append((line, "updater.emulator", "takes only load_s (emulated seconds)"))
        return None
    load_s = options.get("load_s")
    if load_s is None:
        return EmulatorUpdater()
    if isinstance(load_s, bool) or not isinstance(load_s, int | float) or not load_s >= 0:
        problems.append((line, "updater.emulator.load_s", f"must be a number >= 0, got {load_s!r}"))
        return None
    return EmulatorUpdater(float(load_s))


def _check_settings(
    m: LineMap,
    settings: dict[str, Any],
    fleet: FleetConfig,
    has_emulator: bool,
    problems: list[Problem],
    plan: bool = True,
) -> None:
    """The settings by the fleet file's own rules, then the plan on the static weights."""
    own = {k: v for k, v in settings.items() if not (k == "order" and isinstance(v, list))}
    try:
        config = parse_rollout_settings(own, fleet.rollout)
    except ConfigError as exc:
        for p in exc.problems:
            key = p.key.removeprefix("rollout.")
            problems.append((m.key_lines.get(key.split(".")[0], m.line), key, p.message))
        return
    if config.updater is None and not has_emulator:
        message = "no updater: give one here (emulator, command or http) or in the fleet file"
        problems.append((m.line, "updater", message))
    if not plan:
        return
    raw = settings.get("order", config.order)
    order = cast(Order, tuple(raw) if isinstance(raw, list) else raw)
    members = [Member(r.id, r.weight) for r in fleet.replicas]
    try:
        plan_waves(members, config.floor, order)
    except RolloutError as exc:
        key = "order" if "order" in str(exc) and "order" in m else "floor"
        line = m.key_lines.get(key, m.line)
        problems.append((line, key, f"{exc} (planned on the fleet file's weights)"))
