"""The chaos bench's counting: stream outcomes, the kill plan, readmissions, fleet samples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_chaos.py"
    spec = importlib.util.spec_from_file_location("bench_chaos", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_chaos"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _stream(chaos: ModuleType, *chunks: bytes) -> str:
    tally = chaos.SseTally()
    for chunk in chunks:
        tally.feed(chunk)
    return str(tally.outcome())


def test_a_stream_is_complete_only_with_done_even_when_split_mid_line(chaos: ModuleType) -> None:
    assert _stream(chaos, b'data: {"a": 1}\n\ndata: [DO', b"NE]\n\n") == chaos.COMPLETED
    assert _stream(chaos, b'data: {"a": 1}\n\n') == chaos.STREAM_CUT_WITHOUT_ERROR
    assert _stream(chaos, b"") == chaos.STREAM_CUT_WITHOUT_ERROR


def test_an_error_event_marks_the_stream_cut_with_an_error_even_before_done(
    chaos: ModuleType,
) -> None:
    error = b'data: {"error": {"message": "replica gone"}}\n\n'
    assert _stream(chaos, b'data: {"a": 1}\n\n', error) == chaos.STREAM_CUT_WITH_ERROR
    assert _stream(chaos, error, b"data: [DONE]\n\n") == chaos.STREAM_CUT_WITH_ERROR
    assert _stream(chaos, b"event: error\ndata: {}\n\n") == chaos.STREAM_CUT_WITH_ERROR
    # A chunk that merely mentions "error" in its text is no error event.
    text = b'data: {"choices": [{"delta": {"content": "\\"error\\""}}]}\n\ndata: [DONE]\n\n'
    assert _stream(chaos, text) == chaos.COMPLETED


def test_kills_go_round_robin_and_every_replica_is_revived_by_the_end(chaos: ModuleType) -> None:
    kills = chaos.plan_kills(["a", "b", "c"], 22.0, 5.0, 5.0, seed=1)
    assert [k.kill_at for k in kills] == [5.0, 10.0, 15.0, 20.0]
    assert [k.revive_at for k in kills] == [10.0, 15.0, 20.0, 22.0]
    names = [k.replica for k in kills]
    assert sorted(names[:3]) == ["a", "b", "c"]
    assert names[3] == names[0]


def _sample(chaos: ModuleType, t: float, states: dict[str, str], healthy: set[str]) -> object:
    return chaos.Sample(t, states, {r: r in healthy for r in states})


def test_readmission_is_the_first_active_sample_after_the_revival(chaos: ModuleType) -> None:
    first = chaos.Kill("a", 5.0, 10.0, killed_s=5.0, revived_s=10.0)
    again = chaos.Kill("a", 30.0, 35.0, killed_s=30.0, revived_s=35.0)
    samples = [
        _sample(chaos, 6.0, {"a": "ejected"}, set()),
        _sample(chaos, 10.5, {"a": "ejected"}, {"a"}),
        _sample(chaos, 12.0, {"a": "active"}, {"a"}),
        _sample(chaos, 36.0, {"a": "ejected"}, {"a"}),
    ]
    chaos.readmissions([first, again], samples)
    assert (first.readmit_s, first.ejected, first.note) == (2.0, True, "")
    assert (again.readmit_s, again.note) == (None, "not readmitted by the end")


def test_a_replica_killed_again_before_readmission_says_so(chaos: ModuleType) -> None:
    first = chaos.Kill("a", 5.0, 10.0, killed_s=5.0, revived_s=10.0)
    again = chaos.Kill("a", 20.0, 25.0, killed_s=20.0, revived_s=25.0)
    samples = [_sample(chaos, t, {"a": "ejected"}, set()) for t in (6.0, 15.0)]
    samples.append(_sample(chaos, 26.0, {"a": "active"}, {"a"}))
    chaos.readmissions([first, again], samples)
    assert (first.readmit_s, first.note) == (None, "killed again before readmitted")
    assert again.readmit_s == 1.0


def test_fleet_view_counts_ejections_of_replicas_that_answer(chaos: ModuleType) -> None:
    samples = [
        _sample(chaos, 0.0, {"a": "active", "b": "ejected", "c": "ejected"}, {"a", "b"}),
        _sample(chaos, 0.25, {"a": "ejected", "b": "ejected", "c": "ejected"}, {"a", "b"}),
        _sample(chaos, 0.5, {"a": "ejected", "b": "ejected", "c": "ejected"}, set()),
        chaos.Sample(0.75, None, {}),
    ]
    view = chaos.fleet_view(samples)
    assert (view.most_ejected, view.most_ejected_answering) == (3, 2)
    assert view.most_ejected_answering_at == 0.25
    assert (view.fleet_out, view.fleet_out_answering) == (2, 1)
    assert view.fleet_out_answering_first_at == 0.25
    assert view.admin_unanswered == 1
