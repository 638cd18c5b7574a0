"""The checks a scenario can make, and how each is measured from a recording.

Three families, by what they read:

- **per-second** metrics (``imbalance_factor``, ``queue_depth``, ``in_flight``, and a
  replica's ``utilization``) come from the samples taken each second in the window; by
  default every sample must hold (the worst one is reported), or with ``aggregate: mean``
  their mean;
- **request** metrics (latency percentiles and outcome counts) cover the requests that
  *arrived* in the window, optionally of one priority or (for counts) ended on one replica;
  ``throughput_rps`` and ``throughput_fraction`` count completions that *ended* in it, and
  ``dispatched`` the attempts started in it;
- ``state``: a replica's state at one instant;
- **rollout** metrics read what the scenario's rollout step did, at the end of the run:
  ``rollout_phase`` (``equals: done``), ``rollout_capacity_lowest`` (the lowest share of the
  fleet's capacity in service, from the rollout's own status) and ``rollout_behind`` (replicas
  not on the new version by the rollout's account or their own ``/v1/models``).
- **canary** metrics read what the scenario's canary step did, at the end of the run:
  ``canary_phase`` (``equals: rolled back``), ``canary_share`` (the new version's share of
  the split at the end: 0 once it is over) and ``canary_on_new`` (replicas whose own
  ``/v1/models`` names the canary's new version).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from router.scenario.recording import Recorder, RequestRecord
from router.scenario.schema import Check
from router.stats import percentile

__all__ = [
    "CANARY",
    "COUNTS",
    "LATENCIES",
    "METRICS",
    "PER_SECOND",
    "ROLLOUT",
    "CheckResult",
    "Measured",
    "evaluate",
]

PER_SECOND = ("imbalance_factor", "queue_depth", "in_flight", "utilization")
LATENCIES = ("ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s")
COUNTS = ("offered", "completed", "failed", "rejected", "expired", "unfinished", "lost")
RATES = ("throughput_rps", "throughput_fraction", "dispatched")
ROLLOUT = ("rollout_phase", "rollout_capacity_lowest", "rollout_behind")
CANARY = ("canary_phase", "canary_share", "canary_on_new")
METRICS = (*PER_SECOND, *LATENCIES, *COUNTS, *RATES, "state", *ROLLOUT, *CANARY)


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything a run measured, as the checks read it."""

    recorder: Recorder
    end_s: float
    """End of the run in scenario seconds (the last phase's end plus the drain used)."""
    capacity_at: Callable[[float], float | None]
    """The fleet's capacity_rps at a scenario time (its phase's length mix); None: unknown."""
    lost_arrivals: Sequence[float]
    """Arrival times of requests that got no ending and were not in flight at the end."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    """Whether the measurement met the bound (judged or not)."""
    measured: float | str | None
    expected: str
    line: int
    not_judged: str | None = None
    """Why the run cannot judge this check, in words; None when it can."""

    def to_dict(self) -> dict[str, Any]:
        measured = self.measured
        if isinstance(measured, float):
            measured = None if math.isinf(measured) else round(measured, 4)
        out: dict[str, Any] = {
            "name": self.name,
            "ok": self.ok,
            "measured": measured,
            "expected": self.expected,
            "judged": self.not_judged is None,
        }
        if self.not_judged is not None:
            out["not_judged"] = self.not_judged
        return out

    def __str__(self) -> str:
        shown = "unbounded" if self.measured == math.inf else self.measured
        if isinstance(shown, float):
            shown = f"{shown:.4g}"
        return f"{self.name}: measured {shown}, expected {self.expected}"


def expected_text(check: Check) -> str:
    if check.equals is not None:
        return f"== {check.equals}"
    parts = []
    if check.minimum is not None:
        parts.append(f">= {check.minimum:g}")
    if check.maximum is not None:
        parts.append(f"<= {check.maximum:g}")
    return " and ".join(parts)


def evaluate(check: Check, m: Measured) -> CheckResult:
    expected = expected_text(check)
    if check.metric == "state":
        assert check.replica is not None
        assert check.at_s is not None
        state = m.recorder.state_at(check.replica, check.at_s)
        return CheckResult(check.name, state == check.equals, state, expected, check.line)
    if check.metric in ROLLOUT:
        return _rollout(check, m, expected)
    if check.metric in CANARY:
        return _canary(check, m, expected)
    value = _measure(check, m)
    ok = value is not None and _within(check, value)
    return CheckResult(check.name, ok, value, expected, check.line)


def _rollout(check: Check, m: Measured, expected: str) -> CheckResult:
    outcome = m.recorder.rollout
    if outcome is None:  # the step never ran (the simulator, or an interrupted run)
        return CheckResult(check.name, False, None, expected, check.line)
    if check.metric == "rollout_phase":
        ok = outcome.phase == check.equals
        return CheckResult(check.name, ok, outcome.phase, expected, check.line)
    value = (
        outcome.capacity_lowest
        if check.metric == "rollout_capacity_lowest"
        else float(len(outcome.behind))
    )
    return CheckResult(check.name, _within(check, value), value, expected, check.line)


def _canary(check: Check, m: Measured, expected: str) -> CheckResult:
    outcome = m.recorder.canary
    if outcome is None:  # the step never ran (the simulator, or an interrupted run)
        return CheckResult(check.name, False, None, expected, check.line)
    if check.metric == "canary_phase":
        ok = outcome.phase == check.equals
        return CheckResult(check.name, ok, outcome.phase, expected, check.line)
    value = outcome.share if check.metric == "canary_share" else float(len(outcome.on_new))
    return CheckResult(check.name, _within(check, value), value, expected, check.line)


def _within(check: Check, value: float) -> bool:
    if check.minimum is not None and not value >= check.minimum:
        return False
    return check.maximum is None or value <= check.maximum


def _window(check: Check, m: Measured) -> tuple[float, float]:
    return check.start_s, m.end_s if check.end_s is None else check.end_s


def _measure(check: Check, m: Measured) -> float | None:
    start, end = _window(check, m)
    metric = check.metric
    if metric in PER_SECOND:
        return _per_second(check, m, start, end)
    if metric == "lost":
        return float(sum(1 for t in m.lost_arrivals if start <= t < end))
    if metric in ("throughput_rps", "throughput_fraction"):
        return _throughput(check, m, start, end)
    if metric == "dispatched":
        return float(
            sum(
                1
                for t, replica in m.recorder.dispatches
                if start <= t < end and check.replica in (None, replica)
            )
        )
    arrived = [
        r
        for r in m.recorder.requests.values()
        if start <= r.arrival < end and check.priority in (None, r.priority)
    ]
    if metric in LATENCIES:
        return _latency(metric, arrived)
    if metric == "offered":
        return float(len(arrived) + sum(1 for t in m.lost_arrivals if start <= t < end))
    wanted = None if metric == "unfinished" else metric
    return float(
        sum(1 for r in arrived if r.outcome == wanted and check.replica in (None, r.replica))
    )


def _per_second(check: Check, m: Measured, start: float, end: float) -> float | None:
    values: list[float] = []
    for s in m.recorder.samples:
        if not start <= s.t <= end:
            continue
        if check.metric == "utilization":
            values.append(float(s.replicas[str(check.replica)]["utilization"]))
        else:
            values.append(float(getattr(s, check.metric)))
    if not values:
        return None
    if check.aggregate == "mean":
        return sum(values) / len(values)
    # Every sample must hold: the one furthest from holding decides.
    return min(values) if check.minimum is not None and check.maximum is None else max(values)


def _throughput(check: Check, m: Measured, start: float, end: float) -> float | None:
    if end <= start:
        return None
    done = sum(
        1
        for r in m.recorder.requests.values()
        if r.outcome == "completed"
        and r.end is not None
        and start <= r.end < end
        and check.replica in (None, r.replica)
    )
    rate = done / (end - start)
    if check.metric == "throughput_rps":
        return rate
    capacity = _mean_capacity(m, start, end)
    return None if not capacity else rate / capacity


def _mean_capacity(m: Measured, start: float, end: float) -> float | None:
    # Phases may differ in length mix, so capacity is averaged over the window, per second.
    steps = max(1, math.ceil(end - start))
    values = [m.capacity_at(start + (i + 0.5) * (end - start) / steps) for i in range(steps)]
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _latency(metric: str, arrived: list[RequestRecord]) -> float | None:
    if metric.startswith("ttft"):
        # As the simulator reports it: a request that never got a token (expired, or still
        # waiting at the end) was later than any that did; failures and rejections have
        # their own counts.
        values = [
            (r.first_byte - r.arrival) if r.first_byte is not None else math.inf
            for r in arrived
            if r.outcome in ("completed", "expired", None)
        ]
    else:
        values = [
            r.end - r.arrival for r in arrived if r.outcome == "completed" and r.end is not None
        ]
    q = 0.5 if "_p50_" in metric else 0.99
    return percentile(values, q)
