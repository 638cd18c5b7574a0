"""A scenario run live: the real router and the emulated fleet on loopback, real HTTP load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.scenario import load_scenario
from router.scenario.runner_live import run_live
from tests.scenario_helpers import scenario_file

# Ten times faster than life: 12 emulated seconds of load take 1.2 s. At twenty times, each
# emulated replica steps every 1.5 ms of wall time, and on a loaded 2-core CI machine the
# emulator fell behind the scenario's clock (its catch-up is bounded), so a100-0 sometimes
# still held its last request at t=12. The drain window ends as soon as every answer is in;
# it is long so that a starved machine still answers every request (30 s of wall time).
LIVE_DRAIN = """\
name: live-drain
seed: 5
fleet: {file: FLEET, emulated: true, time_scale: 10}
workload:
  phases:
    - {duration: 12, rate: 5}
drain: 300
actions:
  - {at: 4, command: drain, replica: a100-0}
  - {at: 5, fault: slow, replica: v100-0, factor: 2}
checks:
  - {name: none to a100-0 once draining, metric: dispatched, replica: a100-0, from: 4.001, max: 0}
  - {name: a100-0 drained, metric: state, replica: a100-0, at: 12, equals: drained}
  - {name: nothing lost, metric: lost, max: 0}
  - {name: nothing failed, metric: failed, max: 0}
  - {name: work done, metric: completed, min: 20}
"""


async def test_a_short_scenario_runs_live_against_the_emulator(tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = []
    scenario = load_scenario(scenario_file(tmp_path, LIVE_DRAIN))
    report = await run_live(scenario, lines.append)
    assert report.mode == "live"
    kept = report.keeping_up
    assert kept is not None
    # The checks are timed (drained by t=12, none sent from t=4.001): on a machine that fell
    # behind they measure the machine, and the run says so and judges none of them. What the
    # drain must do whatever the machine's speed is asserted below, from the run's own record.
    if report.judged:
        assert not report.failed, [str(c) for c in report.failed]
    else:
        assert kept.behind
        timed = {"a100-0 drained", "none to a100-0 once draining"}
        assert {c.name for c in report.failed} <= timed, [str(c) for c in report.failed]
    rec = report.measured.recorder
    by_name = {c.name: c for c in report.checks}
    assert by_name["a100-0 drained"].measured == rec.state_at("a100-0", 12.0)
    history = [state for _, state in rec.states["a100-0"]]
    assert history == ["active", "draining", "drained"]
    draining_from = rec.states["a100-0"][1][0]
    assert not [t for t, rid in rec.dispatches if rid == "a100-0" and t > draining_from]
    assert any(rid == "a100-0" for _, rid in rec.dispatches)
    samples = [line for line in lines if line["kind"] == "sample"]
    assert [s["t"] for s in samples] == [float(t) for t in range(1, 13)]
    actions = [line for line in lines if line["kind"] == "action"]
    assert [(a["action"], a["ok"]) for a in actions] == [
        ("drain replica=a100-0", True),
        ("slow v100-0 x2", True),
    ]
    summary = report.summary()
    # Every request the client sent got an HTTP answer, and the router saw each of them end.
    assert summary["client"] == {"completed": summary["offered"]}
    assert summary["completed"] == summary["offered"]
