"""The router core: admission, dispatch and every request's ending, with no I/O.

The core is a synchronous state machine driven from outside: the HTTP data plane calls it
from its event loop, the fleet simulator from its virtual clock, tests directly. Drivers learn
what to do through listeners: ``on_assign`` (send this request to this replica), ``on_cancel``
(stop this upstream request), ``on_finish`` (this request ended, once, with its outcome) and
``on_state`` (a replica changed state, with ``Replica.state_reason`` saying why) and
``on_panic`` (the health monitor judged too few replicas healthy and routes to them all, or
no longer does).

Placement is late-binding: a request waits in the admission queue until some replica that can
take it has a free slot, and the strategy picks among those. So a replica that frees a slot
takes the oldest waiting request it can serve, whatever the strategy would have preferred when
that request arrived (work stealing), and per-replica concurrency never exceeds the batch size.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from router.adaptive import TunerChange
from router.admission_queue import AdmissionQueue
from router.capacity import FleetCapacity, Progress, stream_cost
from router.clock import Clock, monotonic
from router.config.schema import FleetConfig
from router.decision_log import EXPLAINED_PER_S, DecisionLog
from router.errors import ControlError
from router.peer_load import STALE_PERIODS, STATS_PERIOD_S, PeerLoad, PeerReport, own_report
from router.pool import ReplicaPool
from router.replica import Replica, ReplicaState
from router.request import Priority, Request, estimate_cost
from router.slow_start import warm_up_limit
from router.snapshot import FleetSnapshot, build_snapshot
from router.stats import RateWindow, ReplicaStats
from router.strategies import Strategy, create_strategy
from router.tuning import Tuner

if TYPE_CHECKING:
    from router.rollout.split import TrafficSplit
    from router.workers.shared_load import SharedLoad

# How far down the queue a dispatch looks for a request some open replica can take; bounds
# the cost of head-of-line requests that fit nowhere right now.
SCAN_LIMIT = 64


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"
    EXPIRED = "expired"


@dataclass(slots=True, eq=False)
class Assignment:
    """One attempt of a request on a replica."""

    request: Request
    replica: Replica
    started: float
    first_byte: float | None = None
    first_token: bool = False
    """Whether ``first_byte`` started a stream, so that its time is a time to first token
    (a non-streamed answer's first byte is the whole answer)."""
    expected_s: float = 0.0
    """What the replica's learned capacity predicted this attempt would take, when sent."""
    share_mark: float = 0.0
    """The replica's share integral when it started (router/capacity.py)."""
    streamed: int = 0
    """Tokens its stream has relayed so far (about one event each), for learned capacity."""


@dataclass(frozen=True, slots=True)
class Finished:
    """How a request ended. Every request gets exactly one."""

    request: Request
    outcome: Outcome
    time: float
    reason: str = ""
    replica: str | None = None
    retry_after_s: float | None = None


class CoreListener:
    """Receives the core's events; override what you need."""

    def on_assign(self, assignment: Assignment) -> None:
        """Start this attempt upstream."""

    def on_cancel(self, assignment: Assignment) -> None:
        """Stop this attempt upstream; the core has already settled the request."""

    def on_finish(self, finished: Finished) -> None:
        """A request ended."""

    def on_attempt(self, assignment: Assignment, ok: bool) -> None:
        """An attempt ended on its replica: well (``ok``) or failed (it may be retried);
        what a canary's judge compares versions by (router/rollout/judge.py)."""

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        """A replica moved from ``old`` to ``replica.state`` (why: ``replica.state_reason``)."""

    def on_panic(self, engaged: bool, reason: str) -> None:
        """Panic mode began (``engaged``) or ended; ``reason`` says why."""

    def on_tune(self, changes: list[TunerChange]) -> None:
        """The adaptive tuners changed these settings (never called with an empty list)."""


class RouterCore:
    def __init__(
        self,
        fleet: FleetConfig,
        *,
        clock: Clock = monotonic,
        rng: random.Random | None = None,
        explained_per_s: float | None = EXPLAINED_PER_S,
        router_id: str = "router",
        peer_stale_after_s: float = STALE_PERIODS * STATS_PERIOD_S,
    ) -> None:
        """``explained_per_s``: the decision log's budget (router/decision_log.py); None
        explains every decision. ``router_id`` names this router to its peers, and
        ``peer_stale_after_s`` is how long a silent peer's load still counts
        (router/peer_load.py)."""
        self.fleet = fleet
        self.settings = fleet.router
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.pool = ReplicaPool(fleet.replicas)
        self.capacity = FleetCapacity(fleet, self.pool.replicas, self.settings.cost.prompt_factor)
        """Each replica's learned service rate and KV size (router/capacity.py)."""
        self.capacity.refresh(clock())
        self.peers = PeerLoad(router_id, self.pool.replicas, stale_after_s=peer_stale_after_s)
        """The other routers' reported load on each replica (router/peer_load.py)."""
        self._report_seq = 0
        self.shared: SharedLoad | None = None
        """The other worker processes of this ``gpurouter serve --workers N``, when it runs
        several: read before each pick, written on each start and end (router/workers)."""
        self.queue = AdmissionQueue(self.settings.queue.size)
        self.stats = [ReplicaStats() for _ in self.pool]
        self.outcomes: Counter[Outcome] = Counter()
        self.arrivals = RateWindow()
        self.decisions = DecisionLog(self.settings.decision_log_size, explained_per_s)
        """The newest explained decisions, oldest first."""
        self.listeners: list[CoreListener] = []
        self._running: dict[str, Assignment] = {}
        stale_after = 3 * fleet.broker.sample_period_s
        self.tuner = Tuner(self.pool.replicas, self.settings.adaptive, stale_after)
        self._dispatching = False
        self._again = False
        self._warming: dict[int, float] = {}
        """When each replica whose slot limit still grows came back (router/slow_start.py)."""
        self.panic: str | None = None
        """Why the health monitor routes to every replica in service, healthy or not (panic
        mode, router/http/health.py); None while it does not."""
        self.split: TrafficSplit | None = None
        """A canary's or blue-green switch's traffic split (router/rollout/split.py)."""
        s = self.settings.strategy
        self.strategy: Strategy = self._attach(create_strategy(s.name, s.params, self.rng))

    # ---- requests -------------------------------------------------------------------------

    def submit(self, request: Request) -> Finished | None:
        """Admit a request; returns its ending at once if it is rejected, else None."""
        now = self.clock()
        self.arrivals.add(now)
        if request.id in self._running or request.id in self.queue:
            raise ValueError(f"request id {request.id} is already in the router")
        if request.cost == 0.0:
            request.cost = estimate_cost(
                request.prompt_tokens, request.max_tokens, self.settings.cost.prompt_factor
            )
        if request.deadline is None:
            request.deadline = now + self.settings.queue.default_deadline_s
        if not any(r.fits(request) for r in self.pool):
            return self._finish(request, Outcome.REJECTED, self._too_big(request))
        if not self.queue.push(request):
            return self._finish(
                request, Outcome.REJECTED, "queue full", retry_after_s=self.retry_after()
            )
        self.dispatch()
        return None

    def first_byte(self, a: Assignment, *, first_token: bool = True) -> None:
        """The replica sent the first byte of its answer. ``first_token``: that byte starts a
        stream; False when it is the whole answer at once (a request not streamed), whose
        time is the whole generation's and is kept out of the TTFT figures and the tuners:
        taken for a first token, it cut the batch size of engines that queued nothing."""
        if self._current(a) and a.first_byte is None:
            a.first_byte = self.clock()
            a.first_token = first_token
            if first_token:
                self.stats[a.replica.index].ttft.add(a.first_byte - a.request.arrival)
                self.tuner.first_byte(a.replica, a.first_byte - a.started)

    def complete(self, a: Assignment, output_tokens: int | None = None) -> None:
        """The attempt finished well."""
        if not self._current(a):
            return
        now = self.clock()
        self._release(a)
        r, req = a.replica, a.request
        stats = self.stats[r.index]
        stats.completions.add(now)
        stats.cost_done.add(now, req.cost)
        stats.output_tokens.add(now, output_tokens if output_tokens is not None else req.max_tokens)
        stats.e2e.add(now - req.arrival)
        r.latency.observe((now - a.started) / max(req.cost, 1.0), now)
        if a.expected_s > 0:
            r.observe_slowdown((now - a.started) / a.expected_s, now)
        produced = output_tokens if output_tokens is not None else req.max_tokens
        lengths = (req.prompt_tokens, produced)
        self.capacity.completed(r, lengths, req.cost, a.share_mark, a.started, now)
        r.completed += 1
        self._attempt_ended(a, True)
        self._finish(req, Outcome.COMPLETED, replica=r.id)
        self._settle(r)
        self.dispatch()

    def fail(self, a: Assignment, reason: str, *, retryable: bool = True) -> Finished | None:
        """The attempt failed; retried elsewhere when it may be, else the request fails."""
        if not self._current(a):
            return None
        self._release(a)
        r, req = a.replica, a.request
        r.failed += 1
        self._attempt_ended(a, False)
        if self.split is not None:
            req.split_failed = r.version
        may_retry = retryable and a.first_byte is None
        if may_retry and req.attempts < self.settings.retries.attempts:
            self.stats[r.index].retries += 1
            self._requeue(req, avoid=r)
            self._settle(r)
            self.dispatch()
            return None
        finished = self._finish(req, Outcome.FAILED, reason, replica=r.id)
        self._settle(r)
        self.dispatch()
        return finished

    def cancel(self, request_id: str, reason: str = "cancelled by client") -> Finished | None:
        """The client went away: the request ends wherever it is."""
        a = self._running.get(request_id)
        if a is not None:
            self._release(a)
            finished = self._finish(a.request, Outcome.FAILED, reason, replica=a.replica.id)
            self._settle(a.replica)
            self.dispatch()
            return finished
        for req in self.queue.waiting():
            if req.id == request_id:
                self.queue.remove(req)
                return self._finish(req, Outcome.FAILED, reason)
        return None

    def expire(self) -> list[Finished]:
        """End the requests whose deadline passed while they waited (and, once a second,
        refresh the learned capacities: every driver calls this on a timer)."""
        now = self.clock()
        if self.capacity.due(now):
            self.refresh_capacity()
        self._warm_up(now)
        if self.peers.any_stale(now):
            self._close_shares(now)
            self._peer_figures(self.peers.expire(now))
        if self.shared is not None:
            # A sibling worker may have freed the slot our queue waits for (nothing else
            # tells us), and the snapshot and /metrics read the figures between requests.
            self._fold_shared(self.shared)
            self.dispatch()
        return [
            self._finish(req, Outcome.EXPIRED, "deadline passed in the queue")
            for req in self.queue.expire(now)
        ]

    def refresh_capacity(self) -> None:
        """Recompute learned capacities now and re-rank the replicas whose figures moved."""
        changed = self.capacity.refresh(self.clock(), self._progress())
        for r in changed:
            self.pool.changed(r)
        if changed:
            self.dispatch()

    def _progress(self) -> dict[int, list[Progress]]:
        """The streams running on each replica whose measurement counts them, as far as they
        have come: a replica whose requests take a minute is measured within seconds
        (router/capacity.py). None is built where none counts (every card modelled)."""
        factor = self.settings.cost.prompt_factor
        out: dict[int, list[Progress]] = {}
        for r in self.pool:
            if not r.running or not self.capacity.counts_streams(r):
                continue
            streams = out[r.index] = []
            for rid in r.running:
                a = self._running.get(rid)
                if a is not None and a.first_token and a.streamed > 0:
                    req = a.request
                    cost = stream_cost(req.prompt_tokens * factor, a.streamed, req.max_tokens)
                    streams.append(Progress(cost, a.share_mark, a.started))
        return out

    # ---- peer routers (router/peer_load.py) ------------------------------------------------

    def load_report(self) -> PeerReport:
        """This router's own load per replica, for its peers (``routers/<id>/stats``)."""
        self._report_seq += 1
        return own_report(self.peers.router, self._report_seq, self.pool.replicas)

    def hear_peer(self, report: PeerReport) -> None:
        """Another router's load report arrived: count it on the replicas it names."""
        now = self.clock()
        self._close_shares(now)
        self._peer_figures(self.peers.heard(report, now))

    def _close_shares(self, now: float) -> None:
        # Learned capacity integrates each replica's concurrency over time (router/capacity.py):
        # close the interval at the old figure before the peers' part of it moves.
        for r in self.pool:
            self.capacity.advance(r, now)

    def _peer_figures(self, changed: list[Replica]) -> None:
        for r in changed:
            self.pool.changed(r)
        if changed:
            self.dispatch()  # a peer's load went down: a slot may have opened

    def retry_after(self) -> float:
        """Seconds a rejected client should wait: the queue's drain time at the current
        rate, at most ``queue.retry_after_max_s``."""
        now = self.clock()
        rate = sum(s.completions.rate(now) for s in self.stats)
        drain = 1.0 if rate <= 0 else max(1.0, len(self.queue) / rate)
        return min(drain, self.settings.queue.retry_after_max_s)

    @property
    def running(self) -> dict[str, Assignment]:
        return self._running

    def snapshot(self) -> FleetSnapshot:
        """An immutable view of fleet, queue and statistics now."""
        if self.shared is not None:
            self._fold_shared(self.shared)
        return build_snapshot(self)

    def tune(self) -> list[TunerChange]:
        """One round of adaptive weights and batch sizes (as configured, router/tuning.py);
        what changed, also told to every listener's ``on_tune``."""
        return self._tuned(self.tuner.round(self.pool.replicas, self.clock()))

    def engines_read(self) -> list[TunerChange]:
        """The engines' metrics were just read (the poller, after each pass): the batch tuner
        checks the new readings, each replica's KV booking takes the engine's usage as its
        scale, and waiting requests may go to freed KV cache."""
        for r in self.pool.replicas:
            self._calibrate_kv(r)
        return self._tuned(self.tuner.readings(self.pool.replicas, self.clock()))

    def _calibrate_kv(self, r: Replica) -> None:
        e, capacity = r.engine, r.kv_limit
        if e is None or e.kv_usage is None or capacity is None:
            return
        was_full = r.kv.full(capacity, r.in_flight)
        queued = bool(e.waiting)
        moved = r.kv.calibrate(e.kv_usage, capacity, r.in_flight, e.received_at, queued)
        if moved and r.kv.full(capacity, r.in_flight) != was_full:
            self.pool.changed(r)

    def _tuned(self, changes: list[TunerChange]) -> list[TunerChange]:
        for r in {self.replica(c.replica) for c in changes}:
            self.pool.changed(r)
        if changes:
            for listener in self.listeners:
                listener.on_tune(changes)
        self.dispatch()
        return changes

    # ---- dispatch -------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Place waiting requests on replicas with free slots, until no more can be placed."""
        if self._dispatching:
            # A listener called back into the core; the outer loop will go round again.
            self._again = True
            return
        self._dispatching = True
        try:
            self._again = True
            while self._again:
                self._again = False
                while len(self.queue):
                    if self.shared is not None:
                        self._fold_shared(self.shared)
                    found = self._find() if self.pool.open_count else None
                    if found is None:
                        if self._end_warm_ups():
                            continue
                        break
                    self._start(*found)
        finally:
            self._dispatching = False

    def _fold_shared(self, shared: SharedLoad) -> None:
        """Take the sibling workers' current figures into the replicas whose figures moved."""
        now: float | None = None
        for r in self.pool.replicas:
            n, cost = shared.others(r)
            if n != r.shared_in_flight or cost != r.shared_cost:
                if now is None:
                    now = self.clock()
                self.capacity.advance(r, now)  # close the interval at the old concurrency
                r.shared_in_flight, r.shared_cost = n, cost
                self.pool.changed(r)

    def _find(self) -> tuple[Request, Replica] | None:
        now = self.clock()
        for scanned, req in enumerate(self.queue.waiting()):
            if scanned >= SCAN_LIMIT:
                break
            # Behind several routers each one's completions free slots for its own queue, and
            # every peer's queue holds about as many as ours (an even balancer): a request's
            # turn for a slot counts them all (shortest-expected-delay weighs waiting by it).
            req.waiting_ahead = (scanned + 1) * (1 + self.peers.count) - 1
            self._choose_version(req)
            replica = self.strategy.pick(req, now)
            if replica is not None:
                return req, replica
        return None

    def _choose_version(self, req: Request) -> None:
        """The one place a traffic split enters routing: it names the version the request
        goes to, and ``Replica.fits`` admits only that version's replicas."""
        split = self.split
        if split is None:
            req.version = None
            return
        if req.split_coin is None:
            req.split_coin = self.rng.random()
        req.version = split.version_for(req, self.pool.replicas)

    def _attempt_ended(self, a: Assignment, ok: bool) -> None:
        for listener in self.listeners:
            listener.on_attempt(a, ok)

    def _start(self, req: Request, r: Replica) -> None:
        now = self.clock()
        log = self.decisions
        if log.maxlen and log.admit(now):
            log.append(self.strategy.explain(req, now, r))
        self.queue.remove(req)
        req.attempts += 1
        self.capacity.advance(r, now)
        a = Assignment(
            req,
            r,
            now,
            expected_s=r.expected_seconds(req.cost),
            share_mark=self.capacity.share_mark(r),
        )
        self.stats[r.index].cost_sent.add(now, req.cost)
        r.running[req.id] = req
        r.own_cost += req.cost
        r.kv.add(req)
        if self.shared is not None:
            self.shared.publish(r)
        self._running[req.id] = a
        self.tuner.started(r)
        self.pool.changed(r)
        for listener in self.listeners:
            listener.on_assign(a)

    # ---- operator actions (called by the control surface) ---------------------------------

    def set_split(self, split: TrafficSplit | None) -> None:
        """Split a model's requests between two versions from the next pick on (None: route
        by name alone); requests running stay where they are."""
        self.split = split
        self.dispatch()

    def set_strategy(self, name: str, params: dict[str, object] | None = None) -> str:
        """Switch strategy for the next decision; in-flight work is untouched."""
        self.strategy = self._attach(create_strategy(name, params, self.rng))
        self.dispatch()
        return f"strategy is now {name}"

    def set_weight(self, replica_id: str, weight: float | None) -> str:
        r = self.replica(replica_id)
        if weight is None:
            r.weight, r.weight_pinned = r.config.weight, False
            msg = f"{r.id}: weight released to {r.weight:g}"
        else:
            if not weight > 0 or weight == float("inf"):
                raise ControlError(f"weight must be a positive number, not {weight!r}")
            r.weight, r.weight_pinned = float(weight), True
            msg = f"{r.id}: weight set to {weight:g}"
        self.pool.changed(r)
        self.dispatch()
        return msg

    def set_batch_size(self, replica_id: str, size: int | None) -> str:
        r = self.replica(replica_id)
        if size is None:
            r.batch_size, r.batch_pinned = r.config.batch_size, False
            msg = f"{r.id}: batch size released to {r.batch_size}"
        else:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ControlError(f"batch size must be an integer >= 1, not {size!r}")
            r.batch_size, r.batch_pinned = size, True
            msg = f"{r.id}: batch size set to {size}"
        self.pool.changed(r)
        self.dispatch()
        return msg

    def drain(self, replica_id: str, reason: str = "") -> str:
        r = self.replica(replica_id)
        if r.state is not ReplicaState.ACTIVE:
            raise ControlError(f"{r.id} is {r.state}; only an active replica can be drained")
        self._set_state(r, ReplicaState.DRAINING, reason)
        self._settle(r)
        return f"{r.id}: draining, {r.in_flight} in flight"

    def undrain(self, replica_id: str, reason: str = "") -> str:
        r = self.replica(replica_id)
        if r.state not in (ReplicaState.DRAINING, ReplicaState.DRAINED):
            raise ControlError(f"{r.id} is {r.state}, not draining or drained")
        self._set_state(r, ReplicaState.ACTIVE, reason)
        self.dispatch()
        return f"{r.id}: active"

    def eject(self, replica_id: str, reason: str = "operator") -> str:
        r = self.replica(replica_id)
        if r.state is ReplicaState.EJECTED:
            raise ControlError(f"{r.id} is already ejected")
        self._set_state(r, ReplicaState.EJECTED, reason)
        return f"{r.id}: ejected ({reason}), {r.in_flight} in flight left to finish"

    def readmit(self, replica_id: str, reason: str = "") -> str:
        r = self.replica(replica_id)
        if r.state is not ReplicaState.EJECTED:
            raise ControlError(f"{r.id} is {r.state}, not ejected")
        self._set_state(r, ReplicaState.ACTIVE, reason)
        self.dispatch()
        return f"{r.id}: readmitted" + (f" ({reason})" if reason else "")

    def set_panic(self, engaged: bool, reason: str) -> None:
        """Enter panic mode or leave it, saying why; listeners hear of a change of mode."""
        if engaged == (self.panic is not None):
            if engaged:
                self.panic = reason  # still in panic: the newer count is kept quietly
            return
        self.panic = reason if engaged else None
        for listener in self.listeners:
            listener.on_panic(engaged, reason)

    def preempt(self, replica_id: str, *, include_high: bool = False, reason: str = "") -> str:
        """Free a replica now: stop taking work, cancel its low-priority work and re-queue it.

        An attempt that has not yet produced a byte is re-run elsewhere from the front of its
        priority class; one already streaming cannot be, and fails with a reason. High-priority
        work keeps running unless ``include_high``; the replica is drained once it is empty.
        """
        r = self.replica(replica_id)
        if r.state is ReplicaState.ACTIVE:
            self._set_state(r, ReplicaState.DRAINING, reason)
        victims = [
            self._running[rid]
            for rid, req in r.running.items()
            if include_high or req.priority is not Priority.HIGH
        ]
        requeued = 0
        for a in victims:
            self._release(a)
            for listener in self.listeners:
                listener.on_cancel(a)
            if a.first_byte is None:
                self._requeue(a.request, avoid=None)
                requeued += 1
            else:
                self._finish(a.request, Outcome.FAILED, "preempted while streaming", r.id)
        self._settle(r)
        self.dispatch()
        failed = len(victims) - requeued
        return f"{r.id}: preempted {len(victims)} ({requeued} re-queued, {failed} failed)"

    def replica(self, replica_id: str) -> Replica:
        r = self.pool.by_id.get(replica_id)
        if r is None:
            raise ControlError(f"no replica {replica_id!r}")
        return r

    # ---- internals ------------------------------------------------------------------------

    def _attach(self, strategy: Strategy) -> Strategy:
        strategy.telemetry_stale_after_s = 3 * self.fleet.broker.sample_period_s
        self.pool.guard_kv(strategy.books_kv)
        strategy.attach(self.pool)
        self.pool.listener = strategy.update
        return strategy

    def _current(self, a: Assignment) -> bool:
        # Stale attempts (preempted, cancelled, already settled) report nothing.
        return self._running.get(a.request.id) is a

    def _release(self, a: Assignment) -> None:
        del self._running[a.request.id]
        r = a.replica
        self.capacity.advance(r, self.clock())
        del r.running[a.request.id]
        # Recomputing when empty keeps float drift from piling up over millions of requests.
        r.own_cost = r.own_cost - a.request.cost if r.running else 0.0
        r.kv.remove(a.request)
        if self.shared is not None:
            self.shared.publish(r)

    def _requeue(self, req: Request, avoid: Replica | None) -> None:
        others = avoid is not None and any(
            o is not avoid and o.state is not ReplicaState.EJECTED and o.fits(req)
            for o in self.pool
        )
        req.avoid = {avoid.index} if avoid is not None and others else set()
        # The request was admitted in time; a retry gets a fresh wait, not a stale deadline.
        fresh = self.clock() + self.settings.queue.default_deadline_s
        req.deadline = max(req.deadline or fresh, fresh)
        self.queue.push_front(req)

    def _settle(self, r: Replica) -> None:
        if r.state is ReplicaState.DRAINING and not r.running:
            self._set_state(r, ReplicaState.DRAINED, "nothing left in flight")
        else:
            self.pool.changed(r)

    def _set_state(self, r: Replica, state: ReplicaState, reason: str) -> None:
        old, r.state, r.state_reason = r.state, state, reason
        returning = state is ReplicaState.ACTIVE and old is not ReplicaState.ACTIVE
        window = self.settings.slow_start_s
        if returning and window > 0:
            self._warming[r.index] = self.clock()
            r.warm_up_limit = warm_up_limit(r.batch_size, 0.0, window)
        elif state is not ReplicaState.ACTIVE:
            self._warming.pop(r.index, None)
            r.warm_up_limit = None
        self.pool.changed(r)
        for listener in self.listeners:
            listener.on_state(r, old)

    def _warm_up(self, now: float) -> None:
        """Grow the slot limits of the replicas warming up (router/slow_start.py)."""
        opened = False
        for index, since in list(self._warming.items()):
            r = self.pool.replicas[index]
            limit = warm_up_limit(r.batch_size, now - since, self.settings.slow_start_s)
            if limit is None:
                del self._warming[index]
            if limit != r.warm_up_limit:
                r.warm_up_limit = limit
                self.pool.changed(r)
                opened = True
        if opened:
            self.dispatch()

    def _end_warm_ups(self) -> bool:
        """A request waits in the queue, and no replica with room takes it: warming replicas
        take it now rather than hold it back (slow start steers work away from a returning
        replica while others have room; it never makes a request wait). True if one did."""
        ended = [self.pool.replicas[i] for i in self._warming]
        self._warming.clear()
        for r in ended:
            r.warm_up_limit = None
            self.pool.changed(r)
        return bool(ended)

    def _finish(
        self,
        req: Request,
        outcome: Outcome,
        reason: str = "",
        replica: str | None = None,
        retry_after_s: float | None = None,
    ) -> Finished:
        finished = Finished(req, outcome, self.clock(), reason, replica, retry_after_s)
        self.outcomes[outcome] += 1
        for listener in self.listeners:
            listener.on_finish(finished)
        return finished

    def _too_big(self, req: Request) -> str:
        return f"no replica can hold {req.total_tokens} tokens (prompt + max_tokens)"
