"""Blue-green (router/rollout/blue_green.py): the fleet file's green set takes none of its
model's requests until the switch; the switch sends them all to it and drains the blue set,
counting down what is still in flight there and saying when it is empty; switch back until
it is released; release only once empty."""

from __future__ import annotations

import pytest

from router.config import parse_fleet
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import RolloutError
from router.replica import ReplicaState
from router.request import Request
from router.rollout.blue_green import BlueGreen, BlueGreenPhase
from tests.recorder import Recorder

FLEET = """\
model: m
nodes:
  - name: n0
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: A100-80GB, memory_gib: 80}
      - {index: 2, model: A100-80GB, memory_gib: 80}
      - {index: 3, model: A100-80GB, memory_gib: 80}
    replicas:
      - {id: b0, endpoint: "http://127.0.0.1:18001", gpus: [0]}
      - {id: b1, endpoint: "http://127.0.0.1:18002", gpus: [1]}
      - {id: g0, endpoint: "http://127.0.0.1:18003", gpus: [2], version: m-v2}
      - {id: g1, endpoint: "http://127.0.0.1:18004", gpus: [3], version: m-v2}
rollout:
  green: m-v2
"""


class Harness:
    def __init__(self) -> None:
        self.core = RouterCore(parse_fleet(FLEET, "fleet.yaml"))
        self.control = ControlSurface(self.core)
        self.recorder = Recorder()
        self.core.listeners.append(self.recorder)
        self.bg = BlueGreen(self.core, self.control, "m-v2")
        self._n = 0

    def send(self, n: int) -> set[str]:
        """``n`` requests for ``m``, left running; the replicas they went to."""
        before = len(self.recorder.assigned)
        for _ in range(n):
            self._n += 1
            assert self.core.submit(Request(f"q{self._n}", 10, 10, 0.0, model="m")) is None
        return {a.replica.id for a in self.recorder.assigned[before:]}

    def steps(self) -> list[str]:
        return [e.args["step"] for e in self.control.audit if e.kind == "rollout"]


def test_the_green_set_takes_none_of_the_models_requests_before_the_switch() -> None:
    h = Harness()
    assert h.bg.blue_ids == ("b0", "b1")
    assert h.bg.green_ids == ("g0", "g1")
    assert h.send(40) == {"b0", "b1"}


def test_the_switch_moves_every_request_to_green_and_counts_the_blue_set_down() -> None:
    h = Harness()
    h.send(6)
    h.bg.switch("alice")
    assert h.send(20) == {"g0", "g1"}
    assert {h.core.replica(r).state for r in h.bg.blue_ids} == {ReplicaState.DRAINING}
    assert h.bg.status()["in_flight"] == 6
    blue = [a for a in h.recorder.assigned if a.replica.id in h.bg.blue_ids]
    for left, a in zip(range(5, -1, -1), blue, strict=True):
        h.core.complete(a)
        assert h.bg.in_flight() == left
        assert ("blue empty" in h.steps()) == (left == 0)
    assert h.bg.emptied
    assert {h.core.replica(r).state for r in h.bg.blue_ids} == {ReplicaState.DRAINED}


def test_switch_back_readmits_the_blue_set_and_holds_green_out_again() -> None:
    h = Harness()
    h.bg.switch("alice")
    h.bg.switch_back("alice")
    assert h.bg.phase is BlueGreenPhase.BLUE
    assert {r.state for r in h.core.pool} == {ReplicaState.ACTIVE}
    assert h.send(40) == {"b0", "b1"}
    assert h.steps() == ["switch", "blue empty", "switch back"]


def test_release_waits_for_the_blue_set_to_be_empty_and_ends_the_switching() -> None:
    h = Harness()
    h.send(2)
    h.bg.switch("alice")
    with pytest.raises(RolloutError, match="still holds 2 requests"):
        h.bg.release("alice")
    for a in list(h.recorder.live(h.core.running)):
        h.core.complete(a)
    h.bg.release("alice")
    assert h.bg.phase is BlueGreenPhase.RELEASED
    assert h.core.split is None
    assert h.send(10) == {"g0", "g1"}  # blue stays drained: the name goes to green
    with pytest.raises(RolloutError, match="released"):
        h.bg.switch_back("alice")


def test_a_switch_needs_a_green_replica_in_service() -> None:
    h = Harness()
    h.core.drain("g0")
    h.core.drain("g1")
    with pytest.raises(RolloutError, match="no green replica"):
        h.bg.switch("alice")
