"""A live run says whether the machine kept up, and a run where it did not judges no check;
a check that missed only because an action took effect late is not judged either."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.loadgen import LoadGenerator, Shot
from router.scenario import load_scenario, run_simulated
from router.scenario.keeping_up import KeepingUp, LoopLag, keeping_up
from router.scenario.report import EXIT_NOT_JUDGED, RunReport
from tests.scenario_helpers import scenario_file

KEPT_UP = KeepingUp(0.01, 0, 0.02, 0.995, router_lag_p99_s=0.3, router_lag_max_s=0.5)
BEHIND = KeepingUp(0.35, 0, 0.02, 0.9, router_lag_p99_s=0.3, router_lag_max_s=0.5)

SHORT = """\
fleet: FLEET
seed: 7
workload:
  lengths: {lognormal: {prompt: [200, 300], output: [100, 150]}}
  phases:
    - {duration: 10, rate: 20}
drain: 20
checks:
  - {name: holds, metric: lost, max: 0}
  - {name: misses, metric: ttft_p99_s, max: 0.000001}
"""


def test_figures_are_scaled_to_scenario_seconds_and_judged_by_p99() -> None:
    # 100 requests, one very late: the p99 is the 99th, not the outlier.
    late = [0.0] * 98 + [0.02, 5.0]
    loop = LoopLag()
    for _ in range(99):
        loop.tick(0.001, 0.001)
    # The router's own half-second stall: its thread was running, not waiting for a CPU.
    loop.tick(0.5, 0.01, at=107.5)
    verdict = keeping_up(late, 0, loop, {"a": 1.0, "b": 0.99}, time_scale=4.0, t0=100.0)
    assert verdict.loadgen_late_p99_s == pytest.approx(0.08)
    assert verdict.router_starved_p99_s == pytest.approx(0.004)
    assert verdict.router_lag_p99_s == pytest.approx(0.004)
    assert verdict.router_lag_max_s == pytest.approx(2.0)
    assert verdict.emulator_clock_min == 0.99
    assert verdict.kept_up
    assert verdict.describe() == (
        "machine kept up: load generator 0.080 s behind schedule, router 0.004 s waiting for "
        "a CPU (p99 each), emulated GPUs at 0.990 of their speed; the router's own loop "
        "stalls: 0.004 s p99, 2.000 s at most (from t=30.0 s)"
    )


def test_a_router_that_stalls_its_own_loop_is_not_excused_as_a_busy_machine() -> None:
    """Lateness while the router's thread ran is the router's doing: it is shown, and the
    checks judge it; only lateness while the thread waited for a CPU is the machine's."""
    own, starved = LoopLag(), LoopLag()
    for _ in range(10):
        own.tick(0.4, 0.0)
        starved.tick(0.4, 0.39)
    assert keeping_up([], 0, own, {}, 1.0).kept_up
    assert keeping_up([], 0, own, {}, 1.0).router_lag_p99_s == pytest.approx(0.4)
    assert keeping_up([], 0, starved, {}, 1.0).behind == (
        "router waited 0.390 s for a CPU (p99, at most 0.1)",
    )
    # Where the kernel does not say how long the thread waited, all of the lag counts.
    unknown = LoopLag()
    unknown.tick(0.4, None)
    assert not keeping_up([], 0, unknown, {}, 1.0).kept_up


def test_each_way_of_falling_behind_is_named() -> None:
    assert KeepingUp(0.11, 0, 0.0, None).behind == (
        "load generator 0.110 s behind schedule (p99, at most 0.1)",
    )
    assert KeepingUp(0.0, 3, 0.0, None).behind == ("3 requests not sent",)
    assert KeepingUp(0.0, 0, 0.2, None).behind == (
        "router waited 0.200 s for a CPU (p99, at most 0.1)",
    )
    assert KeepingUp(0.0, 0, 0.0, 0.96).behind == (
        "emulated GPUs ran at 0.960 of their speed (at least 0.97)",
    )
    assert KeepingUp(0.0, 0, 0.0, None).kept_up  # real endpoints: no emulator clock


def _with(report: RunReport, kept: KeepingUp) -> RunReport:
    from dataclasses import replace

    return replace(report, keeping_up=kept)


@pytest.fixture
def report(tmp_path: Path) -> RunReport:
    return run_simulated(load_scenario(scenario_file(tmp_path, SHORT)), lambda _: None)


def test_a_run_where_the_machine_fell_behind_judges_no_check(report: RunReport) -> None:
    behind = _with(report, BEHIND)
    assert [c.ok for c in behind.checks] == [True, False]  # measured all the same
    assert not behind.judged
    assert not behind.passed
    assert behind.exit_code == EXIT_NOT_JUDGED == 3
    summary = behind.summary()
    assert summary["judged"] is False
    assert summary["machine"]["kept_up"] is False
    assert summary["verdict"] == (
        "checks not judged: machine fell behind: load generator 0.350 s behind schedule "
        "(p99, at most 0.1); emulated GPUs ran at 0.900 of their speed (at least 0.97); "
        "the router's own loop stalls: 0.300 s p99, 0.500 s at most"
    )


def test_a_run_where_the_machine_kept_up_is_judged_as_always(report: RunReport) -> None:
    kept = _with(report, KEPT_UP)
    assert kept.judged
    assert kept.exit_code == 1
    assert kept.summary()["verdict"] == "some checks failed"
    assert kept.summary()["machine"]["kept_up"] is True
    # The simulator's virtual clock never lags: no verdict on the machine at all.
    assert report.keeping_up is None
    assert report.judged
    assert "machine" not in report.summary()


def test_the_text_summary_says_plainly_that_nothing_was_judged(report: RunReport) -> None:
    from console.run_command import _text

    text = _text(_with(report, BEHIND).summary())
    assert "  ---- misses: measured" in text
    assert text.splitlines()[-1].startswith("checks not judged: machine fell behind: ")
    judged = _text(_with(report, KEPT_UP).summary()).splitlines()
    assert judged[-2].startswith("machine kept up: ")
    assert judged[-1] == "some checks failed"


class _SteppingClock:
    """A clock that moves ``step`` seconds each time it is read: a generator on a machine so
    busy that every read of the time finds it later than it planned."""

    def __init__(self, step: float) -> None:
        self._times: Iterator[float] = (i * step for i in range(10**6))

    def __call__(self) -> float:
        return next(self._times)


async def test_the_generator_notes_how_late_each_request_went_out() -> None:
    # A port bound but not listening: every request ends in a refused connection, which is
    # beside the point; what counts is when each one went out against when it was due.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        shots = [Shot(0.0, 10, 1), Shot(0.0, 10, 1), Shot(0.0, 10, 1)]
        generator = LoadGenerator(f"http://127.0.0.1:{port}", "m", clock=_SteppingClock(1.0))
        report = await generator.run(shots, max_requests=3, max_duration_s=1e9, drain_s=5)
    assert report.counts == Counter({"error": 3})
    # The clock reads 0 at the start and 1, 2, 3 as each shot is scheduled; the three
    # requests then go out at 4, 5 and 6, all due at 0.
    assert report.late_s == [4.0, 5.0, 6.0]


LATE_DRAIN = """\
fleet: FLEET
seed: 7
workload:
  lengths: {lognormal: {prompt: [200, 300], output: [100, 150]}}
  phases:
    - {duration: 10, rate: 20}
drain: 20
actions:
  - {at: 5, command: drain, replica: a100-0}
checks:
  - {name: none to a100-0 once draining, metric: dispatched, replica: a100-0, from: 4.001, max: 0}
  - {name: a100-0 draining, metric: state, replica: a100-0, at: 4.5, equals: draining}
  - {name: none to a100-1 either, metric: dispatched, replica: a100-1, from: 4.001, max: 0}
"""


def test_a_check_that_misses_only_because_an_action_took_effect_late_is_not_judged(
    tmp_path: Path,
) -> None:
    """Live, an action takes effect when the event loop gets to it. Here the drain is written
    at 4 s but took effect at 5 s (the simulator ran it at 5): what a100-0 was sent before
    then is not the router's fault, so those checks are not judged, while a miss that stands
    from 5 s on (a100-1 was never drained) is still a failure."""
    from dataclasses import replace

    from router.scenario.report import finish_run

    scenario = load_scenario(scenario_file(tmp_path, LATE_DRAIN))
    ran = run_simulated(scenario, lambda _: None)
    as_written = replace(scenario, actions=(replace(scenario.actions[0], at_s=4.0),))
    m = ran.measured
    report = finish_run(as_written, "live", m.recorder, m.capacity_at, [], lambda: None)
    by_name = {c.name: c for c in report.checks}
    dispatched = by_name["none to a100-0 once draining"]
    assert not dispatched.ok
    assert dispatched.not_judged == (
        "drain replica=a100-0 (due at 4 s) took effect at 5.000 s, after this window opened; "
        "from then on it holds (measured 0)"
    )
    state = by_name["a100-0 draining"]
    assert (
        state.not_judged == "drain replica=a100-0 (due at 4 s) took effect at 5.000 s, after 4.5 s"
    )
    assert by_name["none to a100-1 either"].not_judged is None
    assert report.judged_failures == (by_name["none to a100-1 either"],)
    assert report.exit_code == 1
    assert report.verdict == "some checks failed"
    # Without the genuine miss, the run cannot be judged as written: exit 3, and it says why.
    only_late = replace(report, checks=(dispatched, state))
    assert only_late.exit_code == EXIT_NOT_JUDGED
    assert only_late.verdict == (
        "2 checks not judged (an action took effect late, inside the window); the others hold"
    )
    assert only_late.summary()["checks"][0]["judged"] is False
