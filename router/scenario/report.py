"""The end of a run: checks evaluated, counts added up, the summary line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router.control import ControlSurface
from router.scenario.checks import CheckResult, Measured, evaluate
from router.scenario.recording import ActionRecord, Recorder
from router.scenario.schema import Action, Scenario

__all__ = ["Emit", "RunReport", "apply_command", "finish_run"]

Emit = Callable[[dict[str, Any]], None]
"""Receives each line of a run as it happens: samples and actions (``kind`` says which)."""


@dataclass(frozen=True, slots=True)
class RunReport:
    scenario: Scenario
    mode: str
    """``simulate`` or ``live``."""
    measured: Measured
    checks: tuple[CheckResult, ...]
    counts: dict[str, int]
    capacity_rps: float | None
    extra: dict[str, Any]

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.ok)

    @property
    def passed(self) -> bool:
        return not self.failed

    def summary(self) -> dict[str, Any]:
        """The JSON object printed at the end of a run."""
        return {
            "kind": "summary",
            "scenario": self.scenario.name,
            "mode": self.mode,
            "duration_s": self.scenario.duration_s,
            "capacity_rps": None if self.capacity_rps is None else round(self.capacity_rps, 4),
            **self.counts,
            **self.extra,
            "checks": [c.to_dict() for c in self.checks],
            "passed": self.passed,
        }


def apply_command(control: ControlSurface, action: Action, t: float, rec: Recorder) -> ActionRecord:
    assert action.command is not None
    event = control.apply(action.command, actor="scenario")
    return note_action(rec, action, t, event.ok, event.message)


def note_action(rec: Recorder, action: Action, t: float, ok: bool, message: str) -> ActionRecord:
    record = ActionRecord(round(t, 3), action.line, action.describe(), ok, message)
    rec.actions.append(record)
    return record


def action_line(record: ActionRecord) -> dict[str, Any]:
    return {
        "kind": "action",
        "t": record.t,
        "action": record.action,
        "ok": record.ok,
        "message": record.message,
    }


def finish_run(
    scenario: Scenario,
    mode: str,
    rec: Recorder,
    capacity_at: Callable[[float], float | None],
    lost_arrivals: Sequence[float],
    known_capacity: Callable[[], float | None],
    extra: dict[str, Any] | None = None,
) -> RunReport:
    rec.finish()
    measured = Measured(rec, scenario.duration_s, capacity_at, lost_arrivals)
    results = [evaluate(check, measured) for check in scenario.checks]
    # A drill whose command was refused did not happen as written: that fails the run.
    results += [
        CheckResult(f"action at line {a.line} ({a.action}) applied", False, a.message, "ok", a.line)
        for a in rec.actions
        if not a.ok
    ]
    outcomes = Counter(r.outcome or "unfinished" for r in rec.requests.values())
    counts = {
        "offered": len(rec.requests) + len(lost_arrivals),
        **{k: outcomes.get(k, 0) for k in ("completed", "failed", "rejected", "expired")},
        "unfinished": outcomes.get("unfinished", 0),
        "lost": len(lost_arrivals),
    }
    return RunReport(
        scenario,
        mode,
        measured,
        tuple(results),
        counts,
        known_capacity(),
        extra or {},
    )
