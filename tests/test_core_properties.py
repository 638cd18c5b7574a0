"""Invariants of the core under random operation sequences (hypothesis stateful testing).

Whatever operators and replicas do, in any order: every request ends exactly once or is still
waiting or running; no replica ever holds more than its batch size from dispatch; drained,
draining or ejected replicas and replicas that cannot hold a request are never picked; and no
request waits while a replica that could take it has a free slot (shortest expected delay
may keep one for a full replica that would finish it sooner: then it must be SED's choice).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.clock import ManualClock
from router.core import SCAN_LIMIT, Assignment, CoreListener, Finished, RouterCore
from router.errors import ControlError
from router.replica import ReplicaState
from router.request import Priority, Request
from router.strategies import STRATEGIES
from tests.fleet_factory import make_fleet

STRATEGY_NAMES = sorted(STRATEGIES)


class Checker(CoreListener):
    """Checks each event against the rules as it happens."""

    def __init__(self) -> None:
        self.finished: dict[str, Finished] = {}
        self.violations: list[str] = []

    def on_assign(self, a: Assignment) -> None:
        r, req = a.replica, a.request
        if r.in_flight > r.batch_size:
            self.violations.append(f"{r.id} over batch size: {r.in_flight} > {r.batch_size}")
        if r.state is not ReplicaState.ACTIVE:
            self.violations.append(f"{req.id} sent to {r.state} {r.id}")
        if not r.fits(req):
            self.violations.append(f"{req.id} sent to {r.id}, which cannot hold it")
        if r.index in req.avoid:
            self.violations.append(f"{req.id} retried on {r.id}, where it failed")

    def on_finish(self, f: Finished) -> None:
        if f.request.id in self.finished:
            self.violations.append(f"{f.request.id} ended twice")
        self.finished[f.request.id] = f


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.core: RouterCore | None = None
        self.checker = Checker()
        self.submitted: set[str] = set()
        self.stale: list[Assignment] = []
        self.n = 0

    @precondition(lambda self: self.core is None)
    @rule(
        n=st.integers(1, 6),
        data=st.data(),
        strategy=st.sampled_from(STRATEGY_NAMES),
        queue_size=st.integers(1, 12),
    )
    def build(self, n: int, data: st.DataObject, strategy: str, queue_size: int) -> None:
        weights = data.draw(st.lists(st.floats(0.2, 5.0), min_size=n, max_size=n))
        batches = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        kv = data.draw(st.lists(st.sampled_from([None, 300, 1000, 5000]), min_size=n, max_size=n))
        fleet = make_fleet(
            weights, batches, strategy=strategy, queue_size=queue_size, kv_capacity=kv
        )
        self.core = RouterCore(fleet, clock=self.clock, rng=random.Random(7))
        self.core.listeners.append(self.checker)

    def _live(self) -> list[Assignment]:
        assert self.core is not None
        return list(self.core.running.values())

    @precondition(lambda self: self.core is not None)
    @rule(
        prompt=st.integers(1, 3000),
        out=st.integers(1, 1500),
        priority=st.sampled_from(list(Priority)),
        key=st.sampled_from([None, "alice", "bob"]),
    )
    def submit(self, prompt: int, out: int, priority: Priority, key: str | None) -> None:
        assert self.core is not None
        self.n += 1
        rid = f"q{self.n}"
        self.submitted.add(rid)
        self.core.submit(
            Request(rid, prompt, out, arrival=self.clock(), priority=priority, affinity_key=key)
        )

    @precondition(lambda self: self.core is not None and self.core.running)
    @rule(data=st.data(), first_byte=st.booleans())
    def complete(self, data: st.DataObject, first_byte: bool) -> None:
        assert self.core is not None
        a = data.draw(st.sampled_from(self._live()))
        self.clock.advance(0.1)
        if first_byte:
            self.core.first_byte(a)
        self.core.complete(a, output_tokens=3)
        self.stale.append(a)

    @precondition(lambda self: self.core is not None and self.core.running)
    @rule(data=st.data(), retryable=st.booleans(), first_byte=st.booleans())
    def fail(self, data: st.DataObject, retryable: bool, first_byte: bool) -> None:
        assert self.core is not None
        a = data.draw(st.sampled_from(self._live()))
        if first_byte:
            self.core.first_byte(a)
        self.core.fail(a, "injected", retryable=retryable)
        self.stale.append(a)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def report_on_a_stale_attempt(self, data: st.DataObject) -> None:
        assert self.core is not None
        a = data.draw(st.sampled_from(self.stale))
        if self.core.running.get(a.request.id) is not a:
            before = len(self.checker.finished)
            self.core.complete(a)
            assert len(self.checker.finished) == before

    @precondition(lambda self: self.core is not None and self.submitted)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        assert self.core is not None
        self.core.cancel(data.draw(st.sampled_from(sorted(self.submitted))))

    @precondition(lambda self: self.core is not None)
    @rule(
        data=st.data(),
        action=st.sampled_from(["drain", "undrain", "eject", "readmit", "preempt", "preempt_all"]),
    )
    def operate(self, data: st.DataObject, action: str) -> None:
        assert self.core is not None
        replica = data.draw(st.sampled_from([r.id for r in self.core.pool]))
        try:
            if action == "preempt_all":
                self.core.preempt(replica, include_high=True)
            else:
                getattr(self.core, action)(replica)
        except ControlError:
            pass  # refused as it should be (wrong state); the state must be unchanged

    @precondition(lambda self: self.core is not None)
    @rule(data=st.data(), weight=st.one_of(st.none(), st.floats(0.1, 10.0)))
    def set_weight(self, data: st.DataObject, weight: float | None) -> None:
        assert self.core is not None
        self.core.set_weight(data.draw(st.sampled_from([r.id for r in self.core.pool])), weight)

    @precondition(lambda self: self.core is not None)
    @rule(data=st.data(), size=st.one_of(st.none(), st.integers(1, 5)))
    def set_batch_size(self, data: st.DataObject, size: int | None) -> None:
        assert self.core is not None
        replica = data.draw(st.sampled_from([r.id for r in self.core.pool]))
        self.core.set_batch_size(replica, size)

    @precondition(lambda self: self.core is not None)
    @rule(name=st.sampled_from(STRATEGY_NAMES))
    def switch_strategy(self, name: str) -> None:
        assert self.core is not None
        running = dict(self.core.running)
        self.core.set_strategy(name)
        for rid, a in running.items():
            assert self.core.running.get(rid) is a, "a strategy switch touched in-flight work"

    @precondition(lambda self: self.core is not None)
    @rule(seconds=st.floats(0.0, 40.0))
    def time_passes(self, seconds: float) -> None:
        assert self.core is not None
        self.clock.advance(seconds)
        self.core.expire()

    @invariant()
    def no_rule_was_broken(self) -> None:
        assert self.checker.violations == []

    @invariant()
    def every_request_is_in_exactly_one_place(self) -> None:
        if self.core is None:
            return
        queued = {r.id for r in self.core.queue.waiting()}
        running = set(self.core.running)
        ended = set(self.checker.finished)
        assert not queued & running
        assert not queued & ended
        assert not running & ended
        assert queued | running | ended == self.submitted
        assert len(self.core.queue) == len(queued)
        assert sum(self.core.outcomes.values()) == len(ended)

    @invariant()
    def replica_bookkeeping_matches_the_running_set(self) -> None:
        if self.core is None:
            return
        for r in self.core.pool:
            assert all(self.core.running[rid].replica is r for rid in r.running)
            expected = sum(req.cost for req in r.running.values())
            assert abs(r.outstanding_cost - expected) < 1e-6
            if r.state is ReplicaState.DRAINING:
                assert r.running, f"{r.id} is draining with nothing in flight"

    @invariant()
    def nothing_waits_while_a_replica_could_take_it(self) -> None:
        if self.core is None or self.core.strategy.name == "capacity-aware":
            return  # capacity-aware may hold a request back until free KV allows it
        for i, waiting in enumerate(self.core.queue.waiting()):
            if i >= SCAN_LIMIT:
                break
            takers = [r.id for r in self.core.pool if r.can_take(waiting)]
            if takers and self.core.strategy.name == "shortest-expected-delay":
                # Late binding by design: it may keep a request for a full replica that
                # would finish it sooner. The core must still place whatever SED would.
                waiting.waiting_ahead = i
                chosen = self.core.strategy.pick(waiting, self.clock())
                assert chosen is None, f"{waiting.id} waits while SED would send it to {chosen.id}"
                continue
            assert not takers, f"{waiting.id} waits while {takers} could take it"


TestCore = CoreMachine.TestCase
TestCore.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
