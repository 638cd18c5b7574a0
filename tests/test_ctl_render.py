"""What `gpurouter ctl` prints, from canned admin-API JSON: the status view fits an 80-column
pane and says where each number came from (learned capacity and KV size included); events and
decisions are one line each."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from console.ctl.render import (
    capacity_cell,
    decision_line,
    event_line,
    kv_cell,
    print_status,
    telemetry_lines,
    util_cell,
)
from console.ctl_command import EXIT_CODES
from router.core import RouterCore
from tests.test_emulator_support import Spec, fleet_config

IDS = [f"a100-{i}" for i in range(4)] + [f"v100-{i}" for i in range(4)]


def canned_state() -> dict[str, Any]:
    """The admin API's /admin/state for an idle 8-replica fleet, as JSON would carry it."""
    specs = [Spec(i, gpu="A100-80GB" if i.startswith("a") else "V100-32GB") for i in IDS]
    core = RouterCore(fleet_config(*specs))
    state: dict[str, Any] = json.loads(json.dumps(core.snapshot().to_dict()))
    state["health"] = {i: {"failures_in_row": 0, "ejection": None} for i in IDS}
    return state


def replica(state: dict[str, Any], replica_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in state["replicas"] if r["id"] == replica_id]
    (only,) = found
    return only


def render(state: dict[str, Any]) -> list[str]:
    out = io.StringIO()
    print_status(state, out)
    return out.getvalue().splitlines()


def capacity_rows(lines: list[str]) -> dict[str, str]:
    """The capacity table's rows by replica: the lines after its ``replica  capacity`` head."""
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["replica", "capacity"])
    return {line.split()[0]: line.rstrip() for line in lines[head + 1 : head + 1 + len(IDS)]}


def test_the_status_view_of_eight_replicas_fits_80_columns() -> None:
    lines = render(canned_state())
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert [line.split()[0] for line in lines[5:13]] == IDS
    assert lines[4].split() == [
        "replica",
        "gpu",
        "state",
        "run/bat",
        "weight",
        "util",
        "ttft",
        "p50/p99",
    ]


def test_pinned_weight_and_batch_are_marked_and_busy_telemetry_shows() -> None:
    state = canned_state()
    a = replica(state, "a100-0")
    a.update(
        weight=2.5,
        weight_pinned=True,
        batch_size=4,
        batch_pinned=True,
        in_flight=3,
        utilization=0.623,
        utilization_from_telemetry=True,
        ttft_p50_s=0.042,
        ttft_p99_s=1.3,
        state="draining",
    )
    row, _ = [line.split() for line in render(state) if line.startswith("a100-0 ")]
    assert row == ["a100-0", "A100-80GB", "draining", "3/4*", "1/2.5*", "62%", "tel", "42ms/1.3s"]


def test_a_replica_warming_up_says_so_with_its_limit_and_an_older_routers_state_still_reads() -> (
    None
):
    state = canned_state()
    replica(state, "a100-0")["warm_up_limit"] = 12
    del replica(state, "a100-1")["warm_up_limit"]  # a router from before slow start
    rows = {line.split()[0]: line.split() for line in render(state)[5:13]}
    assert rows["a100-0"][2:4] == ["warming", "12"]
    assert rows["a100-1"][2] == "active"


def test_each_replica_shows_its_learned_capacity_and_kv_size_with_source_and_age() -> None:
    """``12.4 r/s measured 3.0s`` / ``8.3 r/s prior``, the load over it, and the KV cache's
    size with where it came from; all within 80 columns."""
    state = canned_state()
    replica(state, "a100-0").update(
        capacity_rps=12.4,
        capacity_source="measured",
        capacity_age_s=3.0,
        load=0.62,
        kv_capacity_tokens=450_000,
        kv_capacity_source="engine",
        kv_capacity_age_s=2.0,
    )
    replica(state, "a100-1").update(
        capacity_rps=30.0,
        capacity_source="operator",
        capacity_age_s=None,
        kv_capacity_tokens=80_000,
        kv_capacity_source="fleet file",
        kv_capacity_age_s=None,
    )
    replica(state, "v100-0").update(
        capacity_rps=8.3,
        capacity_source="prior",
        capacity_age_s=None,
        load=1.25,
        kv_capacity_tokens=None,
        kv_capacity_source=None,
    )
    lines = render(state)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    rows = capacity_rows(lines)
    assert rows["a100-0"] == "a100-0   12.4 r/s measured 3.0s   62%  450k tok engine 2.0s"
    assert rows["a100-1"].split()[1:4] == ["30.0", "r/s", "operator"]
    assert rows["a100-1"].endswith("80k tok fleet file")
    assert rows["v100-0"].split() == ["v100-0", "8.3", "r/s", "prior", "125%", "—"]
    assert any(line.startswith("capacity: learned req/s") for line in lines)


def test_capacity_and_kv_cells_name_their_source_and_only_a_refined_figure_has_an_age() -> None:
    base = {"capacity_rps": 8.25, "capacity_source": "prior", "capacity_age_s": None}
    assert capacity_cell(base).plain == "8.2 r/s prior"
    assert capacity_cell(base).style == "dim"  # still the performance model's guess
    measured = {**base, "capacity_rps": 12.4, "capacity_source": "measured", "capacity_age_s": 95}
    assert capacity_cell(measured).plain == "12.4 r/s measured 1m35s"
    # Measured only a request or so at once (a card the model does not know, at light load):
    # what it did that many at once, which the cell says.
    few = {**measured, "capacity_rps": 0.8, "capacity_measured_concurrency": 1.3}
    assert capacity_cell(few).plain == "0.8 r/s measured 1m35s (1 at once)"
    assert capacity_cell({**few, "capacity_source": "prior"}).plain == "0.8 r/s prior 1m35s"
    kv = {"kv_capacity_tokens": 1_200_000, "kv_capacity_source": "prior"}
    assert kv_cell({**kv, "kv_capacity_age_s": None}) == "1.2M tok prior"
    assert kv_cell({**kv, "kv_capacity_source": "engine", "kv_capacity_age_s": 0.4}) == (
        "1.2M tok engine 400ms"
    )
    assert kv_cell({"kv_capacity_tokens": None}) == "—"
    booked = {**kv, "kv_capacity_source": "engine", "kv_capacity_age_s": 0.4}
    assert kv_cell({**booked, "kv_booked_tokens": 744_000.0, "kv_full": False}) == (
        "1.2M tok engine 400ms, 62% booked"
    )
    assert kv_cell({**booked, "kv_booked_tokens": 1_092_000.0, "kv_full": True}) == (
        "1.2M tok engine 400ms, 91% booked, full"
    )


def test_a_router_that_does_not_learn_capacity_gets_no_capacity_table() -> None:
    """An older router's state has no capacity fields: the rest of the view still prints."""
    state = canned_state()
    for r in state["replicas"]:
        for key in [k for k in r if k.startswith(("capacity_", "kv_capacity_"))]:
            del r[key]
    lines = render(state)
    assert not any(line.split()[:2] == ["replica", "capacity"] for line in lines)
    assert [line.split()[0] for line in lines[5:13]] == IDS


def test_utilization_says_whether_it_came_from_telemetry_stale_telemetry_or_the_router() -> None:
    base = {"utilization": 0.5, "utilization_from_telemetry": False, "stale": False}
    assert util_cell(base).plain == "50% router"
    assert util_cell({**base, "stale": True}).plain == "50% stale"
    assert util_cell({**base, "utilization_from_telemetry": True}).plain == "50% tel"


def test_the_header_shows_queue_by_priority_and_the_imbalance_band() -> None:
    state = canned_state()
    state["queue"].update(depth=5, by_priority={"high": 1, "normal": 4, "low": 0})
    state.update(imbalance_factor=1.62, band="action", arrivals_rps=12.34, in_flight=17)
    lines = render(state)
    assert lines[0] == f"cluster {state['cluster']} · strategy {state['strategy']}"
    assert lines[1] == "in 12.3 req/s · out 0.0 req/s · 0.0 tok/s · in flight 17"
    assert lines[2] == f"queue 5/{state['queue']['capacity']} (high 1 · normal 4 · low 0)"
    assert lines[3].startswith("imbalance 1.62 (action) · A100-80GB 1.00 · V100-32GB 1.00")


def test_a_health_ejection_and_the_telemetry_feed_get_a_line_each() -> None:
    state = canned_state()
    state["health"]["v100-2"]["ejection"] = {
        "reason": "5 failures in a row",
        "cause": "connect refused",
        "remaining_s": 12.0,
        "in_row": 1,
    }
    state["telemetry"] = {
        "broker": "connected",
        "broker_url": "mqtt://127.0.0.1:1883",
        "nodes": [
            {"node": "n0", "online": True, "stale": False, "dropped": 1},
            {"node": "n1", "online": True, "stale": True, "dropped": 0},
            {"node": "n2", "online": False, "stale": True, "dropped": 0},
        ],
        "dropped_unknown": 2,
    }
    lines = render(state)
    assert "health: v100-2 ejected, probed again in 12.0s: 5 failures in a row" in lines
    assert lines[-6:-4] == [
        "telemetry: broker connected mqtt://127.0.0.1:1883",
        "nodes: 1 live, 1 stale, 1 offline · 3 payloads dropped",
    ]


def test_no_telemetry_line_without_a_feed_and_a_plain_one_when_disabled() -> None:
    assert not any(line.startswith("telemetry:") for line in render(canned_state()))
    disabled: dict[str, Any] = {
        "broker": "disabled",
        "broker_url": None,
        "nodes": [],
        "dropped_unknown": 0,
    }
    assert telemetry_lines(disabled) == ["telemetry: off (no broker configured)"]


def test_an_event_is_one_line_with_who_what_and_the_verdict() -> None:
    command = {
        "seq": 7,
        "at": 1_700_000_000.0,
        "actor": "alice",
        "kind": "weight",
        "args": {"replica": "a100-0", "weight": None},
        "ok": True,
        "message": "a100-0: weight released to 1",
    }
    line = event_line(command)
    assert line.startswith("   7 ")
    assert line.endswith(
        "  alice  weight replica=a100-0 weight=release  ok  a100-0: weight released to 1"
    )
    refused = {**command, "kind": "undrain", "args": {"replica": "x"}, "ok": False, "message": "no"}
    assert event_line(refused).endswith("  alice  undrain replica=x  REFUSED  no")
    strategy = {**command, "kind": "strategy", "args": {"name": "p2c", "params": {"k": 1}}}
    assert "  strategy name=p2c params={k=1}  ok  " in event_line(strategy)
    state = {**command, "actor": "router", "kind": "state", "message": "a: active -> draining"}
    assert event_line(state).endswith("  router  state  ok  a: active -> draining")


def test_a_decision_is_one_line_naming_every_candidate() -> None:
    decision = {
        "strategy": "least-connections",
        "request_id": "req-12",
        "chosen": "a",
        "time": 5.0,
        "candidates": [
            {"replica": "a", "eligible": True, "score": 0.3125, "in_flight": 2},
            {"replica": "b", "eligible": False, "score": None, "in_flight": 8},
            {"replica": "c", "eligible": True, "score": None, "in_flight": 0},
        ],
        "note": "",
        "telemetry_note": "c: telemetry stale",
    }
    assert decision_line(decision) == (
        "req-12  least-connections -> a  (a 0.312, 2 in flight; b not eligible; "
        "c —, 0 in flight)  c: telemetry stale"
    )
    assert " -> (none)  " in decision_line({**decision, "chosen": None})


def test_the_docs_list_the_same_exit_codes_as_the_help() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "ctl.md").read_text()
    assert EXIT_CODES in docs


def test_a_tuner_event_is_one_line_whose_message_says_what_moved_and_why() -> None:
    """Its arguments would repeat the message, so only ``--json`` carries them."""
    tune = {
        "seq": 8,
        "at": 1_700_000_000.0,
        "actor": "tuner",
        "kind": "tune",
        "args": {"replica": "v100-0", "setting": "batch_size", "old": 256, "new": 192},
        "ok": True,
        "message": "v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)",
    }
    assert event_line(tune).endswith(
        "  tuner  tune  ok  v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)"
    )


def test_panic_leads_the_status_and_replicas_kept_in_service_get_a_health_line() -> None:
    state = canned_state()
    state["panic"] = "3 of 8 replicas in service healthy (panic below 50%)"
    state["health"]["a100-1"]["ejection"] = {
        "reason": "5 failed requests in a row",
        "cause": "failures",
        "remaining_s": 35.0,
        "next_probe_s": 4.0,
        "last_probe": "generation probe failed: answered 503",
        "in_row": 3,
    }
    state["health"]["v100-2"]["unhealthy"] = {
        "reason": "2 failed health checks: connection refused",
        "cause": "health_check",
        "kept_in_service": "panic mode",
    }
    lines = render(state)
    assert lines[0] == "PANIC: 3 of 8 replicas in service healthy (panic below 50%); routing to all"
    assert "health: a100-1 ejected, probed again in 4.0s: 5 failed requests in a row" in lines
    kept = "health: v100-2 unhealthy, kept in service (panic mode): 2 failed health checks"
    assert any(line.startswith(kept) for line in lines)


def test_a_panic_event_shows_its_message_alone() -> None:
    event = {
        "seq": 9,
        "at": 1_700_000_000.0,
        "actor": "router",
        "kind": "panic",
        "args": {"engaged": True, "reason": "r"},
        "ok": True,
        "message": "PANIC: r: routing to every replica in service",
    }
    assert event_line(event).endswith(
        "  router  panic  ok  PANIC: r: routing to every replica in service"
    )


def test_an_engine_page_refused_as_nonsense_or_unreadable_gets_a_line_per_replica() -> None:
    state = canned_state()
    assert not any(line.startswith("engine metrics:") for line in render(state))
    state["engine_metrics"] = {
        "errors": {"v100-1": "HTTP 503"},
        "rejected": {"a100-2": 3, "v100-1": 1},
        "last_rejection": {"a100-2": "kv_usage: 7.0 outside 0.0..1.0", "v100-1": "waiting: nan"},
    }
    lines = [line for line in render(state) if line.startswith("engine metrics:")]
    assert lines == [
        "engine metrics: a100-2 3 refused, last good kept: kv_usage: 7.0 outside 0.0..1.0",
        "engine metrics: v100-1 unreadable: HTTP 503",
    ]
