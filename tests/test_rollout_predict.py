"""The prediction before a rollout: the simulator fed the live router's state, deterministic,
bounded by its budget, and refusing what a live start would refuse."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from router.clock import ManualClock
from router.config import load_fleet
from router.core import RouterCore
from router.errors import RolloutError
from router.rollout.predict import Budget, FleetState, fleet_state, predict
from router.rollout.simulated import SimRolloutSpec

NODE = """\
  - name: {name}
    gpus: [{{index: 0, model: {gpu}, memory_gib: {mem}}}]
    replicas: [{{id: {name}, endpoint: "http://127.0.0.1:1", gpus: [0], batch_size: 64}}]
"""
CARDS = {"h100": ("H100-SXM", 80), "a100": ("A100-80GB", 80), "l4": ("L4", 24)}


def _state(tmp_path: Path, names: list[str], load: float) -> FleetState:
    """A fleet of these cards (one replica each), as a live router that has just started
    knows it, with arrivals at ``load`` of its modelled capacity."""
    text = "model: meta-llama/Llama-3.1-8B-Instruct\nnodes:\n" + "".join(
        NODE.format(name=n, gpu=CARDS[n.split("-")[0]][0], mem=CARDS[n.split("-")[0]][1])
        for n in names
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    core = RouterCore(load_fleet(path), clock=ManualClock())
    rps = sum(core.capacity.estimate(r, 0.0).rps for r in core.pool)
    return dataclasses.replace(fleet_state(core), arrival_rps=load * rps)


def _spec(floor: float, order: tuple[str, ...]) -> SimRolloutSpec:
    return SimRolloutSpec("llama-v2", load_s=10.0, floor=floor, order=order)


def test_an_h100_out_is_a_deeper_dip_than_an_l4_out(tmp_path: Path) -> None:
    """The same three A100s beside an H100 or beside an L4, at the same load of each fleet:
    the H100's wave leaves far less in service, and the traffic waits longer for it."""
    a100s = ["a100-0", "a100-1", "a100-2"]
    with_h100 = predict(_state(tmp_path, ["h100-0", *a100s], 0.45), _spec(0.45, ("h100-0", *a100s)))
    with_l4 = predict(_state(tmp_path, ["l4-0", *a100s], 0.45), _spec(0.45, ("l4-0", *a100s)))
    dip_h100, dip_l4 = with_h100.figures, with_l4.figures
    assert dip_h100.capacity_lowest < 0.6 < dip_l4.capacity_lowest
    assert dip_h100.ttft_p99_s is not None
    assert dip_l4.ttft_p99_s is not None
    assert dip_h100.ttft_p99_s > dip_l4.ttft_p99_s
    for p in (with_h100, with_l4):
        assert p.figures.duration_s is not None
        assert p.figures.requests > 0
        assert not p.shortened


def test_the_same_state_gives_the_same_prediction(tmp_path: Path) -> None:
    state = _state(tmp_path, ["a100-0", "a100-1", "l4-0", "l4-1"], 0.5)
    spec = SimRolloutSpec("llama-v2", load_s=5.0, floor=0.5)
    assert predict(state, spec) == predict(state, spec)


def test_a_long_rollout_is_simulated_within_the_budget_with_its_full_load_times(
    tmp_path: Path,
) -> None:
    state = _state(tmp_path, ["a100-0", "a100-1", "a100-2", "a100-3"], 0.5)
    spec = SimRolloutSpec("llama-v2", load_s=600.0, floor=0.7)
    budget = Budget(requests=1500)
    p = predict(state, spec, budget)
    assert p.shortened
    assert p.simulated_requests <= budget.requests
    assert p.simulated_load_s < p.load_s == 600.0
    # Four waves of one A100 each, every one out for its full ten minutes in the duration.
    assert p.figures.duration_s is not None
    assert p.figures.duration_s >= 4 * 600.0
    assert p.note is not None
    assert "shortened" in p.note


def test_the_requests_in_flight_now_are_in_the_prediction(tmp_path: Path) -> None:
    """A backlog (requests in flight and queued at the live router) weighs on the first
    seconds: with no new arrivals, it is all the traffic there is."""
    idle = _state(tmp_path, ["a100-0", "a100-1", "l4-0"], 0.0)
    busy = dataclasses.replace(idle, in_flight={"a100-0": 200, "a100-1": 200}, queued=300)
    spec = SimRolloutSpec("llama-v2", load_s=5.0, floor=0.5)
    assert predict(idle, spec).simulated_requests == 0
    assert predict(busy, spec).simulated_requests == 700


def test_a_floor_that_cannot_be_kept_is_refused_as_a_live_start_is(tmp_path: Path) -> None:
    state = _state(tmp_path, ["h100-0", "a100-0", "l4-0"], 0.3)
    refused = r"alone is \d+% of the fleet's capacity.* under the floor of 75%"
    with pytest.raises(RolloutError, match=refused):
        predict(state, SimRolloutSpec("llama-v2", load_s=5.0, floor=0.75))


def test_a_fleet_measured_slower_than_its_model_is_predicted_slower(tmp_path: Path) -> None:
    """The engines run at the speed the router measured, not the datasheet's: the same fleet
    and arrivals, its A100s measured at two thirds of the model (and the L4s, not measured
    yet, taken to run as far off), wait longer through the same plan."""
    state = _state(tmp_path, ["a100-0", "a100-1", "l4-0", "l4-1"], 0.4)
    slow = dataclasses.replace(
        state, measured={k: v * 2 / 3 for k, v in state.capacity.items() if k.startswith("a")}
    )
    spec = SimRolloutSpec("llama-v2", load_s=5.0, floor=0.5)
    as_modelled, as_measured = predict(state, spec).figures, predict(slow, spec).figures
    assert as_measured.capacity_lowest == pytest.approx(as_modelled.capacity_lowest)
    assert as_modelled.ttft_p99_s is not None
    assert as_measured.ttft_p99_s is not None
    assert as_measured.ttft_p99_s > as_modelled.ttft_p99_s
