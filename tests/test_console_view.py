"""The console's view models: pure functions from router snapshots to what is drawn."""

from __future__ import annotations

from dataclasses import replace

import pytest

from console.actions import ACTIONS, BY_ID, RESERVED_KEYS, resolve_keys
from console.backend import samples_from
from console.screens.value_input import Answer, parse_value
from console.view.capacity import capacity_lines
from console.view.detail import decision_lines, facts
from console.view.events import Watch, alerts, event_line
from console.view.fleet import COLUMNS, SORTS, gpu_rows, select, state_cell, table_rows
from console.view.format import Tone, bar, duration, sparkline, tokens
from console.view.header import Modes, header_lines
from console.view.impact import impact, impact_lines
from console.view.models import LEGEND, model_rows
from console.view.service import service, up_by_model
from router.adaptive import TunerChange
from router.errors import ConfigError
from router.snapshot import ReplicaSnapshot
from router.telemetry.status import (
    DISABLED,
    BrokerState,
    EngineMetricsStatus,
    NodeFeed,
    TelemetryStatus,
)
from tests.console_helpers import WALL, Rig, loaded_rig, telemetry_for


def _text(line: tuple[tuple[str, Tone], ...]) -> str:
    return "".join(t for t, _ in line)


def _cell(cells: tuple[tuple[str, Tone], ...], column: str) -> tuple[str, Tone]:
    """A row's cell by its column's id."""
    return cells[[c.id for c in COLUMNS].index(column)]


def test_bar_fills_in_eighths_and_never_overflows() -> None:
    assert bar(0.0, 4) == "░░░░"
    assert bar(1.0, 4) == "████"
    assert bar(0.5, 4) == "██░░"
    assert bar(7.0, 3) == "███"
    assert len(bar(0.33, 5)) == 5


def test_sparkline_keeps_the_newest_points_right_aligned() -> None:
    assert sparkline([0.0, 1.0], 4) == "  ▁█"
    assert sparkline([0.5] * 10, 3) == "▅▅▅"


def test_durations_pick_a_readable_unit() -> None:
    assert duration(None) == "—"
    assert duration(0.0423) == "42ms"
    assert duration(1.25) == "1.2s"
    assert duration(125) == "2m05s"


def test_every_gpu_is_a_row_and_without_telemetry_utilization_is_the_routers_estimate() -> None:
    rig = loaded_rig()
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), DISABLED, {})
    assert [r.key for r in rows] == ["node-0/0", "node-0/1", "node-0/2", "node-0/3"]
    assert all(not r.util_fresh and not r.telemetry for r in rows)
    cells = table_rows(rows, "node", lambda _: [], {})
    util = _cell(cells[1].cells, "util")[0]
    assert "~" in util  # marked as an estimate, never as a GPU reading
    assert _cell(cells[1].cells, "data") == ("router", Tone.DIM)


def test_fresh_telemetry_gives_per_gpu_readings() -> None:
    rig = loaded_rig()
    status = telemetry_for(rig)
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), status, samples_from(status))
    r1 = rows[1]
    assert r1.util_fresh
    assert r1.util == pytest.approx(0.5)
    assert r1.mem == pytest.approx(34_000 / 81_920)
    assert (r1.power_w, r1.temp_c, r1.state) == (240.0, 63, "active")
    cells = table_rows(rows, "node", lambda _: [0.5], {})[2].cells
    assert "~" not in _cell(cells, "util")[0]
    assert _cell(cells, "power")[0] == "240/400W"


def test_stale_and_offline_nodes_are_marked_in_words_not_only_colour() -> None:
    rig = loaded_rig()
    stale = telemetry_for(rig, stale=frozenset({"node-0"}))
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), stale, samples_from(stale))
    assert {r.state for r in rows} == {"stale"}
    assert all(not r.util_fresh for r in rows)
    assert state_cell("stale")[0] == "⚠ stale"
    off = telemetry_for(rig, offline=frozenset({"node-0"}))
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), off, samples_from(off))
    assert {r.state for r in rows} == {"offline"}
    assert state_cell("offline")[0] == "✖ offline"


def test_operator_states_win_over_data_states() -> None:
    rig = loaded_rig()
    rig.core.drain("r2")
    rig.core.eject("r3")
    status = telemetry_for(rig, stale=frozenset({"node-0"}))
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), status, samples_from(status))
    assert [r.state for r in rows] == ["stale", "stale", "draining", "ejected"]


def test_a_replica_back_in_service_reads_warming_counts_as_up_and_its_detail_says_its_limit() -> (
    None
):
    rig = loaded_rig(requests=0, completed=0)
    rig.core.drain("r2")
    rig.core.undrain("r2")  # slow start: the fleet file's default window
    snap = rig.core.snapshot()
    rows = gpu_rows(rig.core.fleet, snap, DISABLED, {})
    assert [r.state for r in rows] == ["active", "active", "warming", "active"]
    assert state_cell("warming") == ("◔ warming", Tone.ACCENT)
    assert service(rows).up == {"r0", "r1", "r2", "r3"}
    (r2,) = [r for r in snap.replicas if r.id == "r2"]
    assert "(warming up: 1 for now)" in "".join(text for line in facts(r2) for text, _ in line)


def test_decisions_not_fetched_yet_are_not_shown_as_none_having_chosen_the_replica() -> None:
    assert decision_lines([], "r0", 0.0) == [
        (("No recent decision chose this replica.", Tone.DIM),)
    ]
    ((pending,),) = decision_lines(None, "r0", 0.0)
    assert pending[0].startswith("Fetching the recent decisions")


def test_sort_and_filter_choose_and_order_rows() -> None:
    rig = loaded_rig()
    status = telemetry_for(rig)
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), status, samples_from(status))
    assert [r.replica for r in select(rows, "util", "")] == ["r3", "r2", "r1", "r0"]
    assert [r.replica for r in select(rows, "node", "v100")] == ["r2", "r3"]
    assert [r.replica for r in select(rows, "node", "a100 r1")] == ["r1"]
    assert "node" in SORTS
    assert SORTS[0] == "node"


def test_grouped_rows_get_a_node_heading_and_sorted_rows_do_not() -> None:
    rig = loaded_rig()
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), DISABLED, {})
    grouped = table_rows(rows, "node", lambda _: [], {})
    assert grouped[0].heading
    assert grouped[0].key == "node:node-0"
    assert not any(r.heading for r in table_rows(rows, "util", lambda _: [], {}))


def test_header_shows_band_in_words_queue_by_priority_and_telemetry_state() -> None:
    rig = loaded_rig()
    snap = rig.core.snapshot()
    lines = header_lines(snap, DISABLED, Modes(read_only=True, paused=True))
    text = "\n".join(_text(line) for line in lines)
    assert "test" in text
    assert "weighted-least-connections" in text
    assert f"queue {snap.queue.depth}/1024" in text
    assert "(normal 2, low 2)" in text  # depth by priority
    assert f"{snap.imbalance_factor:.2f}" in text
    assert str(snap.band) in text
    assert "broker ○ off" in text
    assert "telemetry off" in text
    assert "READ-ONLY" in text
    assert "paused" in text
    band_cell = next(c for c in lines[1] if str(snap.band) in c[0])
    assert band_cell[1] in (Tone.OK, Tone.WARN, Tone.BAD)


def test_header_counts_fresh_stale_and_dropped() -> None:
    rig = loaded_rig()
    status = telemetry_for(rig, stale=frozenset({"node-0"}))
    text = _text(header_lines(rig.core.snapshot(), status, Modes())[2])
    assert "● connected" in text
    assert "0/1 fresh" in text
    assert "⚠ 1 stale" in text
    assert "dropped 1 lost 2" in text


def test_header_names_replicas_whose_engine_metrics_are_unreadable_or_refused_first() -> None:
    """Before the broker: a fleet of real engines often has no MQTT feed, and at 80 columns
    the end of the line is cut."""
    rig = loaded_rig()
    snap = rig.core.snapshot()
    calm = _text(header_lines(snap, DISABLED, Modes())[2])
    assert "engine /metrics" not in calm
    one = EngineMetricsStatus(
        errors={"r1": "http://127.0.0.1:9/metrics: HTTP 503"},
        rejected={"r0": 2, "r1": 1, "r2": 4},
        last_rejection={"r0": "running: -3.0 outside 0..1000000"},
        refusing=("r0", "r1"),
    )
    line = header_lines(snap, DISABLED, Modes(), engines=one)[2]
    text = _text(line)
    assert "✖ engine /metrics unreadable: r1" in text
    # r1's page is not read now; r2's refusals are past (its latest page was sane).
    assert "⚠ engine /metrics refused values: r0" in text
    assert text.index("engine /metrics") < text.index("broker")
    tones = dict(line)
    assert tones["✖ engine /metrics unreadable: r1"] is Tone.BAD
    assert tones["⚠ engine /metrics refused values: r0"] is Tone.WARN
    many = EngineMetricsStatus(errors={"r0": "refused", "r1": "refused", "r2": "refused"})
    assert "unreadable: 3 replicas" in _text(header_lines(snap, DISABLED, Modes(), engines=many)[2])
    past = EngineMetricsStatus(rejected={"r0": 9}, last_rejection={"r0": "kv_usage: nan"})
    assert "engine /metrics" not in _text(header_lines(snap, DISABLED, Modes(), engines=past)[2])


def test_alerts_say_when_an_engine_page_goes_unreadable_or_carries_nonsense_and_recovers() -> None:
    """Once each way: an exporter that stays broken is not an alert at every poll."""
    calm = Watch("connected", frozenset(), frozenset(), "good", False)
    down = replace(calm, engines=EngineMetricsStatus(errors={"r1": "HTTP 503"}))
    assert alerts(calm, down) == [("✖ r1: engine /metrics unreadable: HTTP 503", Tone.BAD)]
    assert alerts(down, down) == []
    assert alerts(down, calm) == [("● r1: engine /metrics read again", Tone.OK)]
    why = "kv_usage: 7.0 outside 0.0..1.0"
    once = EngineMetricsStatus(rejected={"r0": 1}, last_rejection={"r0": why}, refusing=("r0",))
    again = replace(once, rejected={"r0": 5})
    sane = replace(again, refusing=())
    warn = (f"⚠ r0: engine /metrics value refused, last good kept: {why}", Tone.WARN)
    assert alerts(calm, replace(calm, engines=once)) == [warn]
    assert alerts(replace(calm, engines=once), replace(calm, engines=again)) == []
    assert alerts(replace(calm, engines=again), replace(calm, engines=sane)) == [
        ("● r0: engine /metrics values sane again", Tone.OK)
    ]


def test_token_counts_are_short() -> None:
    assert [tokens(n) for n in (900, 9500, 450_000, 999_999, 1_200_000, 12_000_000)] == [
        "900",
        "9.5k",
        "450k",
        "1.0M",
        "1.2M",
        "12M",
    ]


def _r0(**changes: object) -> ReplicaSnapshot:
    r0 = loaded_rig().core.snapshot().replicas[0]
    return replace(r0, **changes)  # type: ignore[arg-type]


def test_capacity_block_says_where_each_figure_came_from_and_how_old_it_is() -> None:
    measured = _r0(
        capacity_rps=12.4,
        capacity_source="measured",
        capacity_age_s=3.0,
        capacity_prior_rps=8.3,
        capacity_measured_rps=13.1,
        capacity_measured_concurrency=None,
        load=1.2,
        kv_capacity_tokens=450_000,
        kv_capacity_source="engine",
        kv_capacity_age_s=2.0,
        engine_preemptions=7,
    )
    learned, versus, kv = capacity_lines(measured)
    assert _text(learned) == "learned 12.4 req/s  from measured  refined 3.0s ago   load 120% of it"
    assert learned[-1][1] is Tone.WARN  # sent more than it can do
    assert _text(versus) == "prior 8.3 req/s   measured 13.1 req/s"
    assert _text(kv) == "KV cache 450k tokens  from engine, read 2.0s ago   engine preemptions 7"
    few = replace(measured, capacity_measured_concurrency=2.6, batch_size=64)
    assert _text(capacity_lines(few)[1]) == (
        "prior 8.3 req/s   measured 13.1 req/s, for 3 at once of its 64"
    )


def test_capacity_block_of_a_replica_never_measured_or_pinned_by_an_operator() -> None:
    fresh = _r0(
        capacity_rps=8.3,
        capacity_source="prior",
        capacity_age_s=None,
        capacity_prior_rps=8.3,
        capacity_measured_rps=None,
        capacity_measured_concurrency=None,
        load=0.0,
        kv_capacity_tokens=80_000,
        kv_capacity_source="fleet file",
        kv_capacity_age_s=None,
        engine_preemptions=None,
    )
    learned, versus, kv = capacity_lines(fresh)
    assert _text(learned) == (
        "learned 8.3 req/s  from prior  never refined by a completion   load 0% of it"
    )
    assert _text(versus) == "prior 8.3 req/s   measured — (nothing completed yet)"
    assert _text(kv) == "KV cache 80k tokens  from fleet file   engine preemptions —"
    booked = replace(fresh, kv_booked_tokens=20_000.0)
    assert _text(capacity_lines(booked)[2]) == (
        "KV cache 80k tokens  from fleet file   25% booked   engine preemptions —"
    )
    full = replace(fresh, kv_booked_tokens=73_000.0, kv_booking_scale=0.5, kv_full=True)
    kv_line = capacity_lines(full)[2]
    assert _text(kv_line) == (
        "KV cache 80k tokens  from fleet file   91% booked, full (x0.50)   engine preemptions —"
    )
    assert ("91% booked, full", Tone.WARN) in kv_line
    pinned = replace(fresh, capacity_source="operator", capacity_rps=20.0)
    learned, versus, _ = capacity_lines(pinned)
    assert "from operator" in _text(learned)
    assert _text(versus).endswith("(a pinned weight overrides both)")


def test_the_load_column_is_work_over_learned_capacity_and_sorts_busiest_first() -> None:
    rig = loaded_rig()
    snap = rig.core.snapshot()
    loads = {"r0": 0.2, "r1": 1.3, "r2": 0.7, "r3": 0.0}
    snap = replace(snap, replicas=tuple(replace(r, load=loads[r.id]) for r in snap.replicas))
    rows = gpu_rows(rig.core.fleet, snap, DISABLED, {})
    (column,) = [c for c in COLUMNS if c.id == "load"]
    assert column.label == "Load/cap"
    assert [r.replica for r in select(rows, "load", "")] == ["r1", "r2", "r0", "r3"]
    cells = {t.replica: _cell(t.cells, "load") for t in table_rows(rows, "load", lambda _: [], {})}
    assert cells["r1"] == ("130%", Tone.WARN)  # more than the card can do
    assert cells["r2"] == ("70%", Tone.NORMAL)
    assert _cell(table_rows(rows, "load", lambda _: [], {})[0].cells, "run")[0] == "4/4"


def test_the_model_summary_says_capacity_is_learned() -> None:
    assert "learned capacity" in LEGEND


def test_model_summary_flags_a_tier_doing_less_than_its_share_of_learned_capacity() -> None:
    rig = loaded_rig(requests=0, completed=0)
    from router.snapshot import GpuModelSummary

    under = GpuModelSummary("V100", 2, 2, 0.9, 1.0, 0.1, 0.5, 1.0)
    even = GpuModelSummary("A100", 2, 2, 0.5, 9.0, 0.9, 0.85, 1.0)
    rows = model_rows([under, even])
    assert rows[0][5] == ("▼ under", Tone.WARN)
    assert rows[1][5] == ("= even", Tone.OK)
    assert model_rows(rig.core.snapshot().by_gpu_model)[0][5][0] == "· idle"


def test_drain_impact_counts_in_flight_by_priority_and_redistributes_the_share() -> None:
    rig = loaded_rig()
    snap = rig.core.snapshot()
    target = next(r for r in snap.replicas if r.id == "r1")
    running = rig.backend.in_flight("r1")
    i = impact("drain", target, snap.replicas, running, stale=False)
    assert i.in_flight == len(running) == target.in_flight > 0
    assert sum(i.by_priority.values()) == i.in_flight
    assert i.share == pytest.approx(2 / 6)
    assert {rid for rid, _, _ in i.recipients} == {"r0", "r2", "r3"}
    assert sum(after for _, _, after in i.recipients) == pytest.approx(1.0)
    text = "\n".join(_text(line) for line in impact_lines(i))
    assert f"In flight: {i.in_flight}" in text
    assert "33%" in text
    assert "r0  33% → 50%" in text


def test_preempt_impact_separates_requeued_streaming_and_kept_high_priority() -> None:
    rig = loaded_rig(completed=0)
    snap = rig.core.snapshot()
    target = next(r for r in snap.replicas if r.id == "r0")
    running = rig.backend.in_flight("r0")
    high = sum(1 for r in running if r.priority == "high")
    i = impact("preempt", target, snap.replicas, running, stale=True)
    text = "\n".join(_text(line) for line in impact_lines(i))
    # Every request in the rig has sent its first byte: preempted ones cannot be re-run.
    assert f"{len(running) - high} already streaming" in text
    if high:
        assert f"{high} high-priority keep running" in text
    assert text.startswith("⚠ r0's data is stale")


def test_a_tuner_event_line_names_the_tuner_the_replica_the_values_and_the_signal() -> None:
    """Marked as a change the router made itself (not an operator's ✔), in words as well."""
    rig = loaded_rig()
    change = TunerChange("v100-0", "batch_size", 256, 192, "engine queue 40 for 2 rounds")
    rig.control.on_tune([change])
    line = event_line(rig.control.audit[-1])
    assert _text(line) == (
        "22:13:20Z ⇅ tuner: v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)"
    )
    assert line[1] == (" ⇅ ", Tone.ACCENT)
    assert rig.control.audit[-1].at == WALL


def test_alerts_fire_on_changes_for_the_worse_and_on_recovery() -> None:
    calm = Watch("connected", frozenset(), frozenset(), "good", False)
    bad = Watch("reconnecting", frozenset({"n1"}), frozenset({"n2"}), "action", True)
    texts = [t for t, _ in alerts(calm, bad)]
    assert texts == [
        "broker connected → reconnecting",
        "⚠ n1: telemetry stale",
        "✖ n2: agent offline",
        "imbalance good → action",
        "✖ admission queue full: new requests get 429",
    ]
    assert [t for t, _ in alerts(bad, calm)] == [
        "broker reconnecting → connected",
        "● n1: telemetry fresh again",
        "● n2: telemetry fresh again",
        "imbalance action → good",
    ]
    assert alerts(None, bad) == []


def test_default_keys_avoid_tmux_and_shell_keys_and_are_unique() -> None:
    keys = [a.key for a in ACTIONS]
    assert len(set(keys)) == len(keys)
    assert not set(keys) & RESERVED_KEYS
    assert all(not k.startswith("ctrl+") for k in keys)


def test_rebinding_by_action_id_and_unknown_ids_name_the_key() -> None:
    keys = resolve_keys({"drain": "x", "help": "f1"})
    assert keys["drain"] == "x"
    assert keys["help"] == "f1"
    assert keys["quit"] == "q"
    with pytest.raises(ConfigError) as err:
        resolve_keys({"drian": "x", "eject": "q"}, "fleet.yaml")
    text = str(err.value)
    assert "fleet.yaml: console.keys.drian: no such action" in text
    assert "console.keys" in text
    assert "q is already the key of" in text


def test_only_destructive_actions_confirm() -> None:
    assert {a.id for a in ACTIONS if a.confirm} == {"drain", "preempt", "eject"}
    assert all(BY_ID[a].mutates for a in ("strategy", "weight", "batch", "undrain", "readmit"))


def test_value_dialog_parses_numbers_and_empty_means_release() -> None:
    assert parse_value("", integer=False) == Answer(None)
    assert parse_value("release", integer=True) == Answer(None)
    assert parse_value("2.5", integer=False) == Answer(2.5)
    assert parse_value("16", integer=True) == Answer(16)
    assert parse_value("0", integer=True) == "must be at least 1"
    assert parse_value("-1", integer=False) == "must be a positive number"
    assert parse_value("x", integer=True) == "'x' is not a whole number"
    assert parse_value("1e308", integer=False) == (
        "weight must be a number from 1e-06 to 1e+06, not 1e+308"
    )
    assert parse_value("1000000000", integer=True) == (
        "batch size must be a whole number from 1 to 65536, not 1000000000"
    )


# ---- a fleet with nothing behind its endpoints ---------------------------------------------


def _everything(rig: Rig, status: TelemetryStatus, failing: frozenset[str] = frozenset()) -> str:
    """The header and the GPU-models pane as text, from the rows the table draws."""
    snap = rig.core.snapshot()
    rows = gpu_rows(rig.core.fleet, snap, status, samples_from(status), failing=failing)
    s = service(rows)
    header = "\n".join(_text(line) for line in header_lines(snap, status, Modes(), s))
    models = "\n".join(
        "  ".join(t for t, _ in row) for row in model_rows(snap.by_gpu_model, up_by_model(snap, s))
    )
    return f"{header}\n{models}"


def test_an_all_offline_fleet_reads_as_such_in_the_header_and_the_models_pane() -> None:
    """Every row says offline: the header says no replica is up (not "1.00 excellent") and
    the GPU-models pane counts none up (not "Up 2/2")."""
    rig = loaded_rig(requests=0, completed=0)
    text = _everything(rig, telemetry_for(rig, offline=frozenset({"node-0"})))
    assert "excellent" not in text
    assert "imbalance — ✖ no replica up: 4 offline" in text
    assert "A100-80GB  0/2" in text
    assert "V100-32GB  0/2" in text
    assert text.count("✖ none up") == 2


def test_an_all_ejected_fleet_reads_as_such_in_the_header_and_the_models_pane() -> None:
    rig = loaded_rig(requests=0, completed=0)
    for r in ("r0", "r1", "r2", "r3"):
        rig.core.eject(r)
    text = _everything(rig, DISABLED)
    assert "imbalance — ✖ no replica up: 4 ejected" in text
    assert text.count("✖ none up") == 2


def test_replicas_that_fail_their_health_checks_are_failing_not_active() -> None:
    """In service as far as the router's state goes, but their latest request or probe
    failed: their rows say so, and they do not count as up."""
    rig = loaded_rig(requests=0, completed=0)
    failing = frozenset({"r0", "r1", "r2", "r3"})
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), DISABLED, {}, failing=failing)
    assert {r.state for r in rows} == {"failing"}
    assert state_cell("failing") == ("✖ failing", Tone.BAD)
    text = _everything(rig, DISABLED, failing)
    assert "imbalance — ✖ no replica up: 4 failing" in text


def test_a_partly_up_fleet_keeps_its_imbalance_figure_and_counts_its_up_replicas() -> None:
    rig = loaded_rig(requests=0, completed=0)
    rig.core.eject("r0")
    text = _everything(rig, DISABLED, frozenset({"r2"}))
    assert "imbalance 1.00 ✔ excellent" in text
    assert "A100-80GB  1/2" in text
    assert "V100-32GB  1/2" in text


def test_a_node_whose_agent_was_never_heard_is_not_offline() -> None:
    """`gpurouter emulate` runs no agents: replicas that answer are up, their rows show the
    router's state with data age `never`, and the node reads `no agent`, not offline."""
    rig = loaded_rig(requests=0, completed=0)
    feed = NodeFeed("node-0", False, None, False, None, 0, 0, 0, 0)
    status = TelemetryStatus(BrokerState.CONNECTED, "mqtt://127.0.0.1:1883", (feed,))
    rows = gpu_rows(rig.core.fleet, rig.core.snapshot(), status, {})
    assert {r.state for r in rows} == {"active"}
    table = table_rows(rows, "node", lambda _: [], {"node-0": feed})
    assert _cell(table[0].cells, "state") == ("◌ no agent", Tone.WARN)
    assert {_cell(t.cells, "data")[0] for t in table} == {"never"}
    text = _everything(rig, status)
    assert "◌ 1 no agent" in text
    assert "offline" not in text
    assert "no replica up" not in text
    assert "A100-80GB  2/2" in text


def test_panic_mode_leads_the_header_and_its_events_are_marked() -> None:
    """At 80 columns the end of a header line is cut: panic comes first on its line; the
    events pane marks its start in the bad tone and its end in the good one."""
    rig = loaded_rig(requests=0, completed=0)
    rig.core.set_panic(True, "1 of 4 replicas in service healthy (panic below 50%)")
    lines = header_lines(rig.core.snapshot(), DISABLED, Modes())
    assert lines[1][0] == ("✖ PANIC: routing to every replica", Tone.BAD)
    engaged = event_line(rig.control.audit[-1])
    assert _text(engaged) == (
        "22:13:20Z ⚠ router: PANIC: 1 of 4 replicas in service healthy (panic below 50%): "
        "routing to every replica in service"
    )
    assert engaged[1] == (" ⚠ ", Tone.BAD)
    rig.core.set_panic(False, "3 of 4 replicas in service healthy (panic below 50%)")
    assert header_lines(rig.core.snapshot(), DISABLED, Modes())[1][0] == ("queue ", Tone.DIM)
    ended = event_line(rig.control.audit[-1])
    assert ended[1] == (" ⚠ ", Tone.OK)
    assert _text(ended).endswith("routing by health again")


def test_replica_detail_says_why_it_is_ejected() -> None:
    rig = loaded_rig(requests=0, completed=0)
    rig.core.eject("r1", "5 failed requests in a row: r1: cannot connect")
    r1 = next(r for r in rig.core.snapshot().replicas if r.id == "r1")
    lines = facts(r1)
    assert lines[1] == (
        ("why ", Tone.DIM),
        ("ejected: 5 failed requests in a row: r1: cannot connect", Tone.BAD),
    )
    r0 = next(r for r in rig.core.snapshot().replicas if r.id == "r0")
    assert not any(_text(line).startswith("why ") for line in facts(r0))
