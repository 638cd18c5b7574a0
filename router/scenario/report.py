"""The end of a run: checks evaluated, counts added up, the summary line."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router.control import ControlSurface
from router.scenario.checks import CheckResult, Measured, evaluate
from router.scenario.keeping_up import KeepingUp
from router.scenario.recording import ActionRecord, Recorder
from router.scenario.schema import Action, Check, Scenario

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_JUDGED",
    "EXIT_PASSED",
    "Emit",
    "RunReport",
    "apply_command",
    "finish_run",
]

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_NOT_JUDGED = 3
"""A live run that cannot be judged as written: the machine could not keep up (its checks
measured the machine, so none is judged), or a check missed only because an action took
effect late inside its window. A CI job can retry, or run the scenario slower, rather than
report a failure of the fleet."""
EXIT_INTERRUPTED = 130
"""The operator stopped the run (Ctrl+C): the report is partial and no check is judged."""

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
    keeping_up: KeepingUp | None = None
    """Live: whether the machine kept up; None on the simulator (virtual time never lags)."""
    interrupted_at: float | None = None
    """Scenario seconds when the operator stopped the run; None when it ran to its end."""

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """The checks whose measurement missed its bound, judged or not."""
        return tuple(c for c in self.checks if not c.ok)

    @property
    def judged(self) -> bool:
        """False when the run was interrupted, or the machine fell behind a live run (the
        checks measured the machine)."""
        if self.interrupted_at is not None:
            return False
        return self.keeping_up is None or self.keeping_up.kept_up

    @property
    def judged_failures(self) -> tuple[CheckResult, ...]:
        """The checks that failed and are judged: what the fleet (or the router) got wrong."""
        if not self.judged:
            return ()
        return tuple(c for c in self.failed if c.not_judged is None)

    @property
    def unjudged(self) -> tuple[CheckResult, ...]:
        """The checks this run cannot judge (all of them when the machine fell behind)."""
        if not self.judged:
            return self.checks
        return tuple(c for c in self.checks if c.not_judged is not None)

    @property
    def passed(self) -> bool:
        """Every check judged, and every one held."""
        return self.interrupted_at is None and not self.failed and not self.unjudged

    @property
    def exit_code(self) -> int:
        if self.interrupted_at is not None:
            return EXIT_INTERRUPTED
        if not self.judged:
            return EXIT_NOT_JUDGED
        if self.judged_failures:
            return EXIT_FAILED
        return EXIT_NOT_JUDGED if self.unjudged else EXIT_PASSED

    @property
    def verdict(self) -> str:
        """One line: passed, failed, or not judged and why."""
        if self.interrupted_at is not None:
            end = self.scenario.duration_s
            return f"interrupted at t={self.interrupted_at:g} s of {end:g} s: checks not judged"
        if not self.judged:
            assert self.keeping_up is not None
            return "checks not judged: " + self.keeping_up.describe()
        if self.judged_failures:
            return "some checks failed"
        if self.unjudged:
            n = len(self.unjudged)
            return (
                f"{n} check{'s' if n > 1 else ''} not judged (an action took effect late, "
                "inside the window); the others hold"
            )
        return "all checks hold"

    def _check_line(self, check: CheckResult) -> dict[str, Any]:
        if self.judged:
            return check.to_dict()
        why = "machine fell behind" if self.interrupted_at is None else "interrupted"
        return dataclasses.replace(check, not_judged=why).to_dict()

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
            **({} if self.keeping_up is None else {"machine": self.keeping_up.to_dict()}),
            **({} if self.interrupted_at is None else {"interrupted_at": self.interrupted_at}),
            "checks": [self._check_line(c) for c in self.checks],
            "judged": self.judged,
            "passed": self.passed,
            "verdict": self.verdict,
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
    keeping_up: KeepingUp | None = None,
    interrupted_at: float | None = None,
) -> RunReport:
    """The report of a run; ``interrupted_at`` (scenario seconds) ends it early: no check is
    judged, and the requests still queued or running then count as ``stopped``."""
    rec.finish()
    measured = Measured(rec, scenario.duration_s, capacity_at, lost_arrivals)
    late = _late_actions(scenario, rec)
    results = [
        _judge(check, evaluate(check, measured), measured, late) for check in scenario.checks
    ]
    # A drill whose command was refused did not happen as written: that fails the run.
    results += [
        CheckResult(f"action at line {a.line} ({a.action}) applied", False, a.message, "ok", a.line)
        for a in rec.actions
        if not a.ok
    ]
    if interrupted_at is not None:
        results = []  # the run's windows were cut short: nothing to measure them by
    outcomes = Counter(r.outcome or "unfinished" for r in rec.requests.values())
    counts = {
        "offered": len(rec.requests) + len(lost_arrivals),
        **{k: outcomes.get(k, 0) for k in ("completed", "failed", "rejected", "expired")},
        "unfinished": outcomes.get("unfinished", 0),
        "lost": len(lost_arrivals),
    }
    if interrupted_at is not None:
        counts["stopped"] = counts.pop("unfinished")
    return RunReport(
        scenario,
        mode,
        measured,
        tuple(results),
        counts,
        known_capacity(),
        extra or {},
        keeping_up,
        interrupted_at,
    )


_Late = tuple[float, float, str]
"""An action that took effect after its time: (due, took effect, what), scenario seconds."""


def _late_actions(scenario: Scenario, rec: Recorder) -> list[_Late]:
    # Live, an action takes effect when the event loop gets to it, a little after its time;
    # on the simulator never.
    # Both are in time order: the actions as the file schedules them, the records as applied.
    pairs = zip(scenario.actions, rec.actions, strict=False)
    return [(a.at_s, r.t, r.action) for a, r in pairs if r.t > a.at_s]


def _judge(check: Check, result: CheckResult, m: Measured, late: Sequence[_Late]) -> CheckResult:
    """A check that missed only because an action took effect after its window opened (or
    after the instant it looks at) is not judged: the drill did not run as written there. It
    is judged again from when the action took effect; if it misses from then on too, the miss
    stands."""
    if result.ok:
        return result
    for at, applied, what in late:
        if check.metric == "state":
            assert check.at_s is not None
            if at <= check.at_s < applied:
                reason = (
                    f"{what} (due at {at:g} s) took effect at {applied:.3f} s, "
                    f"after {check.at_s:g} s"
                )
                return dataclasses.replace(result, not_judged=reason)
            continue
        if not at <= check.start_s < applied:
            continue
        narrowed = evaluate(dataclasses.replace(check, start_s=applied), m)
        if narrowed.ok:
            reason = (
                f"{what} (due at {at:g} s) took effect at {applied:.3f} s, after this window "
                f"opened; from then on it holds (measured {_shown(narrowed.measured)})"
            )
            return dataclasses.replace(result, not_judged=reason)
    return result


def _shown(value: float | str | None) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
