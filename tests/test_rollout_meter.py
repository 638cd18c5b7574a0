"""The rollout meter: the router's own accounting of the queue's peak and of the TTFT of the
requests that arrived while a rollout ran, on a real router core with a manual clock."""

from __future__ import annotations

import math
from pathlib import Path

from router.clock import ManualClock
from router.config import load_fleet
from router.core import Assignment, CoreListener, RouterCore
from router.request import Request
from router.rollout.meter import RolloutMeter

MIXED = Path(__file__).parent.parent / "examples" / "fleets" / "mixed-a100-v100.yaml"


class _Attempts(CoreListener):
    def __init__(self) -> None:
        self.started: dict[str, Assignment] = {}

    def on_assign(self, assignment: Assignment) -> None:
        self.started[assignment.request.id] = assignment


def _core() -> tuple[RouterCore, ManualClock, _Attempts]:
    clock = ManualClock()
    core = RouterCore(load_fleet(MIXED), clock=clock)
    for r in core.pool:
        core.set_batch_size(r.id, 1)  # eight slots: the ninth request waits in the queue
    attempts = _Attempts()
    core.listeners.append(attempts)
    return core, clock, attempts


def _submit(core: RouterCore, clock: ManualClock, rid: str) -> None:
    core.submit(Request(rid, 100, 50, arrival=clock.now))


def test_the_meter_reads_the_queues_peak_and_the_ttft_of_the_window() -> None:
    core, clock, attempts = _core()
    before = "r-before"
    _submit(core, clock, before)
    meter = RolloutMeter(core)
    for k in range(10):
        _submit(core, clock, f"r{k}")
    assert len(core.queue) == 3
    clock.now = 1.0
    for rid in ("r0", "r1"):
        core.first_byte(attempts.started[rid])
    clock.now = 2.0
    core.complete(attempts.started["r0"])  # the queue, 3 deep, is read as it ends
    core.first_byte(attempts.started[before])
    core.complete(attempts.started[before])  # arrived before the window: not counted
    figures = meter.figures(0.8)
    assert figures.peak_queue == 3
    assert figures.requests == 1
    assert figures.ttft_p99_s == 1.0
    assert figures.capacity_lowest == 0.8
    assert figures.duration_s is None
    meter.close(3.0)
    clock.now = 4.0
    _submit(core, clock, "after")  # after the window: neither counted nor read
    core.complete(attempts.started["r1"])
    figures = meter.figures(0.8)
    assert figures.duration_s == 3.0
    assert figures.requests == 2
    assert not meter.settled  # r2..r9 arrived in the window and have not ended


def test_a_request_of_the_window_that_expires_in_the_queue_is_later_than_any() -> None:
    core, clock, attempts = _core()
    meter = RolloutMeter(core)
    for k in range(9):
        _submit(core, clock, f"r{k}")
    clock.now = 1.0
    core.first_byte(attempts.started["r0"])
    core.complete(attempts.started["r0"])  # r8 takes its slot
    clock.now = 1000.0
    for k in range(9, 11):
        _submit(core, clock, f"late{k}")  # queued behind full replicas
    clock.now = 10_000.0
    core.expire()
    figures = meter.figures(1.0)
    assert figures.requests == 3
    assert figures.ttft_p99_s == math.inf
    assert figures.to_dict()["ttft_p99_s"] is None


def test_a_non_streamed_answer_is_counted_but_not_timed_as_a_first_token() -> None:
    # Its first byte is the whole answer (RouterCore.first_byte): seconds of generation that
    # would put the meter's p99 above the simulator's prediction, which times first tokens.
    core, clock, attempts = _core()
    meter = RolloutMeter(core)
    for rid in ("streamed", "whole"):
        _submit(core, clock, rid)
    clock.now = 0.5
    core.first_byte(attempts.started["streamed"])
    clock.now = 9.0
    core.first_byte(attempts.started["whole"], first_token=False)
    for rid in ("streamed", "whole"):
        core.complete(attempts.started[rid])
    figures = meter.figures(1.0)
    assert figures.requests == 2
    assert figures.ttft_p99_s == 0.5


def test_a_window_of_non_streamed_answers_alone_has_no_ttft() -> None:
    core, clock, attempts = _core()
    meter = RolloutMeter(core)
    _submit(core, clock, "whole")
    clock.now = 4.0
    core.first_byte(attempts.started["whole"], first_token=False)
    core.complete(attempts.started["whole"])
    figures = meter.figures(1.0)
    assert (figures.requests, figures.ttft_p99_s) == (1, None)
