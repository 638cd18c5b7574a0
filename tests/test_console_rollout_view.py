"""The console's rollout views as plain data: the form's reading, the plan's lines, the
prediction's place (nothing at all without one), the progress lines, the JSON conversion
both backends share, and a rollout step's mark in the events pane."""

from __future__ import annotations

from typing import Any

import pytest

from console.rollout.form import RolloutRequest, read_form
from console.rollout.model import Figures, preview_from_json, progress_from_json
from console.view.events import event_line
from console.view.format import Tone
from console.view.rollout import Line, plan_lines, prediction_lines, progress_lines
from router.control import Event


def text(lines: list[Line]) -> str:
    return "\n".join("".join(t for t, _ in line) for line in lines)


PREVIEW: dict[str, Any] = {
    "version": "m-v2",
    "plan": {
        "floor": 0.6,
        "order": ["l4-0", "l4-1", "h100-0"],
        "lowest": 0.64,
        "waves": [
            {"replicas": ["l4-0", "l4-1"], "remaining": 0.8},
            {"replicas": ["h100-0"], "remaining": 0.64},
        ],
    },
    "shares": {"l4-0": 0.1, "l4-1": 0.1, "h100-0": 0.36},
    "settings": {
        "floor": 0.6,
        "order": "weakest-first",
        "drain_timeout_s": 300.0,
        "on_drain_timeout": "preempt",
        "ready_timeout_s": 900.0,
        "updater": "command: systemctl restart vllm@{replica}",
    },
    "prediction": None,
}

STATUS: dict[str, Any] = {
    "id": "rollout-3",
    "version": "m-v2",
    "phase": "failed",
    "plan": PREVIEW["plan"],
    "wave": 1,
    "steps": {"l4-0": "updated", "l4-1": "updated", "h100-0": "flagged"},
    "versions": {"l4-0": "m-v2", "l4-1": "m-v2", "h100-0": "m"},
    "capacity_now": 0.64,
    "capacity_lowest": 0.55,
    "requests_moved": 2,
    "waited_for": 5,
    "error": "h100-0: the update failed: exit 1",
}


def test_the_form_reads_shares_orders_and_a_command_and_names_a_bad_field() -> None:
    asked = read_form(
        {
            "version": " m-v2 ",
            "floor": "75%",
            "order": "b, a",
            "drain": "30",
            "on_timeout": "preempt",
            "updater": "systemctl restart vllm@{replica}",
        }
    )
    assert asked == RolloutRequest(
        "m-v2",
        {
            "floor": 0.75,
            "order": ["b", "a"],
            "drain_timeout_s": 30.0,
            "on_drain_timeout": "preempt",
            "updater": {"command": {"run": "systemctl restart vllm@{replica}"}},
        },
    )
    assert read_form({"version": "m-v2", "order": "strongest-first"}) == RolloutRequest(
        "m-v2", {"order": "strongest-first"}
    )
    assert read_form({"version": "m-v2", "floor": ""}) == RolloutRequest("m-v2", {})
    assert read_form({"version": ""}) == (
        "version: give the model name the replicas will serve (no spaces)"
    )
    assert read_form({"version": "m", "drain": "soon"}) == (
        "drain timeout: 'soon' is not a number of seconds"
    )
    assert read_form({"version": "m", "on_timeout": "kill"}) == (
        "then: 'kill' is not one of wait, preempt"
    )


def test_the_plan_names_each_wave_with_shares_and_what_stays_in_service() -> None:
    shown = text(plan_lines(preview_from_json(PREVIEW)))
    assert "floor 60% · weakest-first · drain 300 s, then preempt · ready 900 s" in shown
    assert "updater command: systemctl restart vllm@{replica}" in shown
    assert "wave 1  l4-0 10%, l4-1 10%  → in service 80%" in shown
    assert "wave 2  h100-0 36%  → in service 64%" in shown
    assert "2 waves; lowest in service 64% (floor 60%)" in shown


def test_the_prediction_has_no_line_without_one_and_its_figures_with_one() -> None:
    assert prediction_lines(preview_from_json(PREVIEW)) == []
    assert preview_from_json(PREVIEW).prediction is None
    unknown = preview_from_json({**PREVIEW, "prediction_error": "no prediction: no profile"})
    assert text(prediction_lines(unknown)) == "no prediction: no profile"
    given = preview_from_json(
        {
            **PREVIEW,
            "prediction": {
                "capacity_lowest": 0.64,
                "peak_queue": 12,
                "ttft_p99_s": 0.41,
                "duration_s": 52.0,
            },
        }
    )
    assert given.prediction == Figures(0.64, 12, 0.41, 52.0)
    assert text(prediction_lines(given)) == (
        "predicted: capacity at lowest 64% · peak queue 12 · p99 TTFT 0.41 s · 52 s"
    )


def test_progress_shows_the_prediction_beside_what_was_measured() -> None:
    figures = {"capacity_lowest": 0.75, "peak_queue": 3, "ttft_p99_s": 1.0, "duration_s": 60.0}
    measured = {**figures, "capacity_lowest": 0.76, "ttft_p99_s": 2.02, "duration_s": 66.2}
    shown = text(
        progress_lines(progress_from_json({**STATUS, "prediction": figures, "measured": measured}))
    )
    assert "predicted: capacity at lowest 75% · peak queue 3 · p99 TTFT 1.00 s · 60 s" in shown
    assert "measured:  capacity at lowest 76% · peak queue 3 · p99 TTFT 2.02 s · 66 s" in shown
    assert "predicted" not in text(progress_lines(progress_from_json(STATUS)))


def test_progress_shows_phase_wave_capacity_each_replica_and_the_error() -> None:
    progress = progress_from_json(STATUS)
    lines = progress_lines(progress)
    shown = text(lines)
    assert "rollout-3: m-v2 failed, wave 2 of 2" in shown
    assert "capacity in service 64% now, 55% at lowest (floor 60%)" in shown
    assert "2 requests moved, 5 waited for" in shown
    assert "h100-0      2  flagged      m" in shown
    assert "l4-0        1  updated      m-v2" in shown
    assert shown.endswith("error: h100-0: the update failed: exit 1")
    lowest = next(c for line in lines for c in line if "at lowest" in c[0])
    assert lowest[1] is Tone.BAD  # under the floor
    before = progress_lines(progress_from_json({**STATUS, "wave": None, "error": None}))
    assert "not started" in text(before)
    assert "error" not in text(before)


@pytest.mark.parametrize("broken", ["plan", "steps", "capacity_now"])
def test_a_status_missing_a_key_is_a_value_error(broken: str) -> None:
    with pytest.raises(ValueError, match="not a rollout's status"):
        progress_from_json({k: v for k, v in STATUS.items() if k != broken})
    with pytest.raises(ValueError, match="not a rollout preview"):
        preview_from_json({k: v for k, v in PREVIEW.items() if k != "shares"})


def test_a_rollout_step_is_marked_in_the_events_pane_and_a_failed_one_as_failed() -> None:
    ok = Event(1, 0.0, "rollout", "rollout", {"step": "updated"}, True, "v0: HTTP 202 in 0.1 s")
    failed = Event(2, 0.0, "rollout", "rollout", {"step": "failed"}, False, "v0: timed out")
    assert event_line(ok)[1] == (" ⟳ ", Tone.ACCENT)
    assert event_line(failed)[1] == (" ✖ ", Tone.BAD)
