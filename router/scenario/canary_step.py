"""A scenario step that starts a canary (docs/rollouts.md#canary), checked when it is read.

``- {at: 20, canary: {version: llama-v2, replicas: [v0], canary: {steps: [10, 50]},
updater: emulator}}``: the new version, the canary replicas (moved to it by the updater when
they do not run it yet), ``manual: true`` to hold the share where the operator puts it, the
canary's rules (the keys of the fleet file's ``rollout.canary``) and any key of the
``rollout:`` section for the rollouts the canary runs (its replicas there and, on a
rollback, back). Times are in scenario seconds, shortened by the time scale live.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from router.config.schema import CanaryConfig, FleetConfig
from router.scenario.rollout_step import Problem, RolloutStep, read_rollout_step
from router.yaml_lines import LineMap

__all__ = ["CANARY_OWN_KEYS", "CanaryStep", "read_canary_step"]

CANARY_OWN_KEYS = ("replicas", "manual", "canary")
_CANARY_TIMES = ("dwell_s", "window_s", "check_interval_s")


@dataclass(frozen=True, slots=True)
class CanaryStep:
    rollout: RolloutStep
    """The version, the settings (with ``canary``, the rules) and the emulator updater."""
    replicas: tuple[str, ...]
    manual: bool = False

    @property
    def version(self) -> str:
        return self.rollout.version

    def describe(self) -> str:
        how = "manual" if self.manual else "stepped"
        return f"canary {self.version} on {', '.join(self.replicas)} ({how})"

    def live_body(
        self, control_url: str, stable_name: str, time_scale: float, base: CanaryConfig
    ) -> dict[str, Any]:
        """``POST /admin/split``'s ``canary``, as a live run starts it: times in wall
        seconds (the fleet file's canary rules filled in, so that they are scaled too)."""
        settings = self.rollout.live_settings(control_url, stable_name, time_scale)
        given = dict(settings.get("canary") or {})
        rules = {k: getattr(base, k) for k in _CANARY_TIMES} | given
        settings["canary"] = {
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
            **{k: (v / time_scale if k in _CANARY_TIMES else v) for k, v in rules.items()},
        }
        settings["canary"]["steps"] = list(settings["canary"]["steps"])
        return {
            "action": "canary",
            "version": self.version,
            "replicas": list(self.replicas),
            "manual": self.manual,
            "settings": settings,
        }


def read_canary_step(
    m: LineMap, fleet: FleetConfig | None, emulated: bool
) -> tuple[CanaryStep | None, list[Problem]]:
    """The step written as mapping ``m``; every problem found, each with its line and key."""
    step, problems = read_rollout_step(m, fleet, emulated, own=CANARY_OWN_KEYS, plan=False)
    replicas = _replicas(m, fleet, problems)
    manual = m.get("manual", False)
    if not isinstance(manual, bool):
        problems.append((m.key_lines["manual"], "manual", f"must be true or false, got {manual!r}"))
    if step is None or replicas is None or problems:
        return None, problems
    return CanaryStep(step, replicas, bool(manual)), problems


def _replicas(
    m: LineMap, fleet: FleetConfig | None, problems: list[Problem]
) -> tuple[str, ...] | None:
    if "replicas" not in m:
        problems.append((m.line, "replicas", "missing required key 'replicas' (the canary's)"))
        return None
    given = m["replicas"]
    line = m.key_lines["replicas"]
    if not isinstance(given, list) or not given or not all(isinstance(r, str) for r in given):
        problems.append((line, "replicas", "must be a list of replica ids"))
        return None
    if fleet is not None:
        ids = [r.id for r in fleet.replicas]
        for rid in given:
            if rid not in ids:
                problems.append((line, "replicas", f"no replica {rid!r} (known: {', '.join(ids)})"))
                return None
        if len(set(given)) == len(ids):
            problems.append((line, "replicas", "a canary leaves some replicas on the old version"))
            return None
    return tuple(dict.fromkeys(given))
