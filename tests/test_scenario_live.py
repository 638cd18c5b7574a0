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
# still held its last request at t=12.
LIVE_DRAIN = """\
name: live-drain
seed: 5
fleet: {file: FLEET, emulated: true, time_scale: 10}
workload:
  phases:
    - {duration: 12, rate: 5}
drain: 20
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
    # Every check holds; whether this machine kept up is its own verdict, not this test's
    # (asserting it would make the test depend on how busy the machine is).
    assert not report.failed, [str(c) for c in report.failed]
    assert report.keeping_up is not None
    assert report.mode == "live"
    samples = [line for line in lines if line["kind"] == "sample"]
    assert [s["t"] for s in samples] == [float(t) for t in range(1, 13)]
    assert samples[-1]["replicas"]["a100-0"]["state"] == "drained"
    actions = [line for line in lines if line["kind"] == "action"]
    assert [(a["action"], a["ok"]) for a in actions] == [
        ("drain replica=a100-0", True),
        ("slow v100-0 x2", True),
    ]
    summary = report.summary()
    # Every request the client sent got an HTTP answer, and the router saw each of them end.
    assert summary["client"] == {"completed": summary["offered"]}
    assert summary["completed"] == summary["offered"]
