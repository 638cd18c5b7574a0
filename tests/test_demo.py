"""The demo's parts that need no sockets: options, load schedule, lines and summary."""

from __future__ import annotations

import itertools
import json
import socket
from collections import Counter
from pathlib import Path

import pytest

from console.cli import main
from console.demo_command import summary_lines
from router.core import RouterCore
from router.demo import DEFAULT_FLEET, Demo, RunTally, StrategySwitch, snapshot_line
from router.demo.fleet_file import default_fleet_path
from router.demo.load import DemoLoad, offered_rps, swing_phases, swinging_shots
from router.demo.report import stop_outcomes
from router.sim.workload import LognormalMix
from router.telemetry.status import DISABLED
from tests.fleet_factory import make_fleet

MIX = LognormalMix((100, 200), (50, 100))


def test_the_default_fleet_is_found_from_any_directory(tmp_path: Path) -> None:
    path = default_fleet_path(tmp_path)
    assert path.is_file()
    assert path.parts[-3:] == DEFAULT_FLEET.parts


def test_the_demo_starts_on_round_robin_whatever_the_fleet_file_says() -> None:
    demo = Demo(make_fleet(strategy="weighted-least-connections"))
    assert demo.fleet.router.strategy.name == "round-robin"


def test_the_offered_rate_swings_between_the_low_and_high_fractions() -> None:
    phases = swing_phases(DemoLoad(low=0.5, high=0.9, phase_s=10), 100.0, MIX, time_scale=2)
    rates = [offered_rps(phases, t) for t in (0, 25, 45, 65, 85)]
    assert rates == [50.0, 90.0, 70.0, 90.0, 50.0]  # the cycle (80 emulated s) repeats


def test_the_load_goes_on_past_one_cycle_in_time_order_until_stopped() -> None:
    phases = swing_phases(DemoLoad(phase_s=1), 20.0, MIX, time_scale=1)
    stop = False
    shots = swinging_shots(phases, seed=3, stopped=lambda: stop)
    first = list(itertools.islice(shots, 300))
    times = [s.at_s for s in first]
    assert times == sorted(times)
    assert times[-1] > 4.0  # beyond the first cycle of four 1 s phases
    stop = True
    assert next(shots, None) is None


def test_bad_load_fractions_are_refused() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        DemoLoad(low=0.9, high=0.5)


def test_a_snapshot_line_is_json_with_the_fleet_and_the_telemetry_freshness() -> None:
    core = RouterCore(make_fleet())
    line = snapshot_line(3.0, core.snapshot(), DISABLED, offered_rps=12.5, client=Counter())
    assert json.loads(json.dumps(line)) == line
    assert line["strategy"] == "weighted-least-connections"
    assert line["queue_depth"] == 0
    assert set(line["replicas"]) == {"r0", "r1", "r2", "r3"}
    assert line["replicas"]["r0"]["state"] == "active"
    assert line["replicas"]["r0"]["utilization_from_telemetry"] is False
    assert line["telemetry"] == {"broker": "disabled", "nodes": {}}


def test_the_summary_counts_lost_requests_and_imbalance_per_strategy() -> None:
    tally = RunTally()
    for strategy, factor in (("round-robin", 2.0), ("round-robin", 1.6), ("wlc", 1.1)):
        tally.add({"strategy": strategy, "imbalance_factor": factor, "throughput_rps": 10.0})
    tally.switches.append(StrategySwitch(2.0, "wlc", "ctl:me"))
    client = Counter({"completed": 40, "error": 2, "cut_off": 3})
    errors = Counter({"ServerDisconnectedError: Server disconnected": 2})
    summary = tally.summary(3.0, {"completed": 40, "failed": 3}, client, errors)["summary"]
    assert summary["lost"] == 2
    assert summary["lost_by_error"] == {"ServerDisconnectedError: Server disconnected": 2}
    assert summary["mean_throughput_rps"] == 10.0
    assert summary["imbalance"] == {
        "mean": 1.567,
        "max": 2.0,
        "by_strategy": {"round-robin": 1.8, "wlc": 1.1},
    }
    assert summary["strategy_switches"] == [{"t": 2.0, "strategy": "wlc", "actor": "ctl:me"}]


def test_a_taken_replica_port_fails_in_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet = tmp_path / "fleet.yaml"
        fleet.write_text(ONE_REPLICA_FLEET.replace("PORT", str(port)), encoding="utf-8")
        code = main(["demo", "--headless", "--fleet", str(fleet), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert f"port {port} of replica solo" in err
    assert "is taken" in err


def test_malformed_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--headless", "--load", "lots"]) == 2
    assert "--load expects LOW:HIGH" in capsys.readouterr().err
    assert main(["demo", "--headless", "--duration", "0"]) == 2
    assert "--duration must be > 0" in capsys.readouterr().err


ONE_REPLICA_FLEET = """\
cluster: taken
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: node
    gpus: [{index: 0, model: A100-80GB, memory_gib: 80}]
    replicas:
      - {id: solo, endpoint: "http://127.0.0.1:PORT", gpus: [0]}
"""


def test_requests_the_stop_cut_off_are_counted_as_stopped_not_failed() -> None:
    """What ended after the operator's stop, otherwise than completed, ended because of it."""
    at_stop = {"completed": 90, "failed": 3}
    final = {"completed": 100, "failed": 80, "expired": 1}
    assert stop_outcomes(final, at_stop) == {
        "completed": 100,
        "failed": 3,
        "rejected": 0,
        "expired": 0,
        "stopped": 78,
    }
    assert stop_outcomes(final, None) == {
        "completed": 100,
        "failed": 80,
        "rejected": 0,
        "expired": 1,
    }
    tally = RunTally()
    tally.add({"strategy": "round-robin", "imbalance_factor": 2.0, "throughput_rps": 10.0})
    summary = tally.summary(3.0, final, Counter(), at_stop=at_stop)["summary"]
    assert summary["outcomes"]["stopped"] == 78


def test_the_printed_summary_reads_as_sentences_not_python_dicts() -> None:
    tally = RunTally()
    for strategy, factor in (("round-robin", 4.0), ("weighted-least-connections", 1.2)):
        tally.add({"strategy": strategy, "imbalance_factor": factor, "throughput_rps": 10.0})
    tally.switches.append(StrategySwitch(29.4, "weighted-least-connections", "ctl:me"))
    final = {"completed": 172, "failed": 122}
    summary = tally.summary(13.2, final, Counter(), at_stop={"completed": 170})["summary"]
    assert summary_lines(summary) == [
        "demo stopped after 13.2 s",
        "  requests: 172 completed, 0 failed, 122 ended by the stop (running when it came); "
        "0 lost (no HTTP answer at all)",
        "  throughput: 10.0 req/s on average (round-robin 10.0, weighted-least-connections 10.0)",
        "  imbalance: 2.60 on average, 4.00 at most (round-robin 4.00, "
        "weighted-least-connections 1.20)",
        "  strategy switches: t=29.4 s weighted-least-connections (ctl:me)",
    ]
