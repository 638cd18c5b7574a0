"""The fleet simulator: the real router core on a virtual clock, over emulated engines.

Discrete-event: arrivals, engine steps and timers are events on one heap; the clock jumps from
one to the next. The core (queue, strategy, dispatch) is the very code the live router runs;
only the replicas are models (``router.sim.engine``). Everything random comes from one seed,
so the same seed gives the same numbers.

The simulated router knows what the live one would, and nothing more: the fleet file as
written (no KV capacity or context length it does not give), each engine's ``/metrics`` as
the live poller reads them (``Replica.engine``, every ``engine_metrics_interval_s`` of the
fleet's health settings; never with 0), and its own accounting of what it sent and what came
back. A request carries the ``max_tokens`` its client sent; the engine generates the arrival's
own output length, at most that. A request longer than a replica's context or KV cache is
refused by the engine before its first byte (HTTP 400, ``context_length_exceeded``), as the
emulator and vLLM refuse it, and the live proxy's handling of that answer follows.

Scripted runs (``gpurouter run --simulate``) add four things, none of which changes a plain
run: callbacks at given virtual times (``at``), the request an arrival becomes
(``make_request``, to set its priority), faults on a replica (``kill``, ``revive``,
``slow``, ``fail_fraction``), which the live router's own health monitor sees as the live one
would: failed attempts are retried elsewhere and, enough of them in a row, eject the replica
(within the monitor's limits: its maximum ejected share, panic mode) until a readmission
probe finds it back: one at every ``check_interval_s`` during the ejection window, and one
when it ends; and version switches (``switch_version``: what a replica's engine serves, as
the emulator's ``POST /versions/<replica>`` restarts it onto another). ``slow`` and
``fail_fraction`` given a ``version`` stand for that version's build, as the emulator's
version faults do: they act only while the replica serves it.

Several routers (``routers=Routers(count=N)``, router/sim/routers.py) put N router cores, each
with its own queue, strategy, learned capacity and health monitor, in front of the same
engines: an L4 balancer gives each arrival to one of them, each publishes its own load per
replica every ``stats_interval_s`` and the others count it (router/peer_load.py) a broker hop
later; with ``sharing=False`` none hears of the others. Router 0 draws from the seed as a
plain run does, so one router is exactly a plain run.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from router.clock import ManualClock
from router.config.schema import FleetConfig, ReplicaConfig, StrategyConfig
from router.core import Assignment, CoreListener, Finished, Outcome, RouterCore
from router.http.health import Ejection, HealthMonitor
from router.imbalance import capacity_loads, imbalance_factor
from router.perf.profiles import ProfileCatalog, default_catalog
from router.replica import EngineLoad, Replica, ReplicaState
from router.request import Request
from router.sim.engine import BLOCK_TOKENS, Engine, Sequence, StepCost
from router.sim.replica_model import deployment_for, engine_for
from router.sim.routers import Balancer, Routers
from router.sim.workload import Arrival
from router.stats import percentile

ARRIVAL, STEP, EXPIRE, TUNE, CALL, ENGINE_METRICS, PUBLISH = range(7)
WARMUP_SHARE = 0.2
REFUSED_AFTER_S = 0.001
"""How long an attempt on a dead or failing replica takes to fail (a refused connection), and
how long an engine takes to answer 400 to a request it cannot hold."""


@dataclass(slots=True)
class _Fault:
    """What is wrong with one simulated replica (all false or zero when healthy)."""

    dead: bool = False
    fail_fraction: float = 0.0
    slow_factor: float = 1.0
    of_version: str | None = None
    """The version ``slow`` and ``fail_fraction`` were set for (they act only while the
    replica serves it); None: for the card, whatever it serves."""


@dataclass(slots=True)
class _Record:
    arrival: float
    generates: int | None = None
    """Tokens the engine will generate (the arrival's output length), however much the
    client allowed; None: as many as the request's ``max_tokens``."""
    first_token: float | None = None
    end: float | None = None
    outcome: Outcome | None = None
    output_tokens: int = 0
    replica: str | None = None
    router: int = 0
    """Which router the balancer gave it to."""


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    id: str
    gpu_model: str
    completed: int
    throughput_rps: float
    capacity_rps: float
    utilization: float
    """The replica's load as the live router computes it (router/imbalance.py): work sent in
    the steady-state window plus work still held when it closed, over what the replica does in
    the window at the router's learned capacity; above 1 when asked more than it can do."""
    busy_fraction: float
    """Share of the time the engine was stepping (what NVML calls utilization)."""
    preemptions: int


@dataclass(frozen=True, slots=True)
class SimResult:
    strategy: str
    duration_s: float
    offered: int
    completed: int
    failed: int
    rejected: int
    expired: int
    unfinished: int
    """Still queued or running when the run stopped (not lost: the run was cut off)."""
    lost_requests: int
    """Submitted but in no ending and not in flight: must be 0."""
    throughput_rps: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    replicas: tuple[ReplicaResult, ...]

    @property
    def imbalance_factor(self) -> float:
        return imbalance_factor(r.utilization for r in self.replicas)

    def utilization_by_gpu_model(self) -> dict[str, float]:
        groups: dict[str, list[float]] = {}
        for r in self.replicas:
            groups.setdefault(r.gpu_model, []).append(r.utilization)
        return {k: sum(v) / len(v) for k, v in groups.items()}


class Simulation(CoreListener):
    def __init__(
        self,
        fleet: FleetConfig,
        strategy: str,
        *,
        seed: int = 0,
        strategy_params: Mapping[str, Any] | None = None,
        catalog: ProfileCatalog | None = None,
        capacities: Mapping[str, float] | None = None,
        routers: Routers | None = None,
    ) -> None:
        """``routers``: several router cores in front of the fleet (router/sim/routers.py);
        None: one, as every plain run. ``strategy_params`` None: the fleet file's
        ``router.strategy.params`` when it names the same strategy, else none."""
        if strategy_params is None and fleet.router.strategy.name == strategy:
            strategy_params = fleet.router.strategy.params  # the fleet file's, for its own
        settings = replace(
            fleet.router, strategy=StrategyConfig(strategy, dict(strategy_params or {}))
        )
        self.fleet = replace(fleet, router=settings)
        self.clock = ManualClock()
        self.routers = routers or Routers()
        # Router 0 draws from the seed itself, so one router gives exactly a plain run.
        self.cores = [
            RouterCore(
                self.fleet,
                clock=self.clock,
                rng=random.Random(seed if k == 0 else seed * 7919 + k),
                router_id=f"router-{k}",
                peer_stale_after_s=self.routers.peer_stale_after_s(),
            )
            for k in range(self.routers.count)
        ]
        self.core = self.cores[0]
        """The first router (the only one in a plain run)."""
        for core in self.cores:
            core.listeners.append(self)
        self._balancer = Balancer(self.routers, random.Random(seed + 2))
        catalog = catalog or default_catalog()
        self.engines: list[Engine] = [engine_for(r.config, catalog) for r in self.core.pool]
        self.capacities = dict(capacities or {})
        self._stepping = [False] * len(self.engines)
        self._events: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self._live: dict[str, Assignment] = {}
        self._records: dict[str, _Record] = {}
        self._pending: Arrival | None = None
        self._dispatched = [0.0] * len(self.engines)
        self._held = [0.0] * len(self.engines)
        """Work each replica still held when the steady-state window closed."""
        self._duration = 0.0
        self._calls: dict[int, Callable[[], None]] = {}
        self._faults = [_Fault() for _ in self.engines]
        self._base_costs: list[StepCost] = [e.cost for e in self.engines]
        self.served: list[tuple[str, ...]] = [_first_served(r.config) for r in self.core.pool]
        """What each replica's engine serves, as its ``/v1/models`` would list it: its version
        first (the fleet file's, else its model), then the names it also answers to."""
        self._fault_rng = random.Random(seed + 1)
        pairs = zip(self.core.pool, self.engines, strict=True)
        self._longest = [_longest_request(r, e, catalog) for r, e in pairs]
        """Per replica, the longest request (prompt plus max_tokens) its engine accepts."""
        self.healths = [HealthMonitor(core, self.fleet.router.health) for core in self.cores]
        """Each router's own health monitor: passive ejection after failed attempts."""
        self.health = self.healths[0]

    # ---- core listener ---------------------------------------------------------------------

    def on_assign(self, a: Assignment) -> None:
        i = a.replica.index
        req = a.request
        # Utilization is read over the same steady-state window as throughput; dispatches in
        # the drain after the last arrival would overstate it.
        if WARMUP_SHARE * self._duration < self.clock.now <= self._duration:
            self._dispatched[i] += req.cost
        fault = self._faults[i]
        if fault.dead or fault.fail_fraction:
            failure = self._failure(i)
            if failure is not None:
                self.at(self.clock.now + REFUSED_AFTER_S, lambda: self._attempt_failed(a, failure))
                return
        asked = req.prompt_tokens + req.max_tokens
        if asked > self._longest[i]:
            reason = (
                f"{a.replica.id} answered 400: the request needs {asked} tokens, "
                f"it holds {self._longest[i]} (context_length_exceeded)"
            )
            self.at(self.clock.now + REFUSED_AFTER_S, lambda: self._refused(a, reason))
            return
        self._live[req.id] = a
        rec = self._records.get(req.id)
        wanted = req.max_tokens if rec is None or rec.generates is None else rec.generates
        self.engines[i].add(Sequence(req.id, req.prompt_tokens, min(wanted, req.max_tokens)))
        if not self._stepping[i]:
            self._kick(i)

    def on_cancel(self, a: Assignment) -> None:
        self._live.pop(a.request.id, None)
        self.engines[a.replica.index].cancel(a.request.id)

    def on_finish(self, finished: Finished) -> None:
        rec = self._records[finished.request.id]
        rec.end = finished.time
        rec.outcome = finished.outcome
        rec.replica = finished.replica

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        k = self._router_of(replica)
        ejection = self.healths[k].ejections.get(replica.index)
        if replica.state is ReplicaState.EJECTED and ejection is not None:
            self._next_readmit_probe(k, replica.index, ejection)

    def _router_of(self, replica: Replica) -> int:
        """The router whose view of the fleet ``replica`` is (each core has its own)."""
        for k, core in enumerate(self.cores):
            if core.pool.replicas[replica.index] is replica:
                return k
        raise ValueError(f"{replica.id} belongs to no router of this simulation")

    def _owner(self, a: Assignment) -> int:
        return self._records[a.request.id].router

    # ---- the event loop --------------------------------------------------------------------

    def run(
        self, arrivals: Iterable[Arrival], duration_s: float, drain_s: float = 60.0
    ) -> SimResult:
        """Feed ``arrivals`` (sorted by time) for ``duration_s``, then let work finish for up
        to ``drain_s`` more virtual seconds."""
        self._duration = duration_s
        self.at(duration_s, self._close_window)
        source = iter(arrivals)
        self._next_arrival(source)
        self._push(1.0, EXPIRE, 0)
        interval = self.fleet.router.adaptive.interval_s
        tuning = self.fleet.router.adaptive.weights or self.fleet.router.adaptive.batch_sizes
        if tuning:
            self._push(interval, TUNE, 0)
        poll = self.fleet.router.health.engine_metrics_interval_s
        if poll > 0:
            # As the live poller: a first reading at start, then one per interval.
            self._push(0.0, ENGINE_METRICS, 0)
        every = self.routers.stats_interval_s
        if self.routers.exchanging:
            # Routers start at unrelated instants: their stats ticks are not in step.
            for k in range(self.routers.count):
                self._push(self._balancer.rng.uniform(0.0, every), PUBLISH, k)
        stop = duration_s + drain_s
        while self._events:
            t, _, kind, index = heapq.heappop(self._events)
            if t > stop:
                break
            self.clock.now = t
            if kind == ARRIVAL:
                self._arrive(source, duration_s)
            elif kind == STEP:
                self._step_done(index)
            elif kind == EXPIRE:
                for core in self.cores:
                    core.expire()
                if self._busy():
                    self._push(t + 1.0, EXPIRE, 0)
            elif kind == TUNE:
                for core in self.cores:
                    core.tune()
                if self._busy():
                    self._push(t + interval, TUNE, 0)
            elif kind == ENGINE_METRICS:
                self._engine_metrics()
                if self._busy():
                    self._push(t + poll, ENGINE_METRICS, 0)
            elif kind == PUBLISH:
                self._publish(index)
                if self._busy():
                    self._push(t + every, PUBLISH, index)
            elif kind == CALL:
                self._calls.pop(index)()
        return self._result(duration_s)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the virtual clock reaches ``t`` (during ``run``)."""
        self._seq += 1
        self._calls[self._seq] = fn
        heapq.heappush(self._events, (t, self._seq, CALL, self._seq))

    def _publish(self, k: int) -> None:
        """Router ``k``'s stats message: its own load, to every other router a broker hop
        later (each hop its own delay, as each subscriber's delivery is)."""
        report = self.cores[k].load_report()
        for j, core in enumerate(self.cores):
            if j != k:
                self.at(self.clock.now + self._balancer.delay(), partial(core.hear_peer, report))

    def _close_window(self) -> None:
        pools = [core.pool.replicas for core in self.cores]
        self._held = [sum(rs[i].own_cost for rs in pools) for i in range(len(self.engines))]

    def make_request(self, request_id: str, arrival: Arrival) -> Request:
        """The request an arrival becomes; override to give it a priority or affinity key.

        It carries the ``max_tokens`` the client sends; the engine will generate the
        arrival's ``output_tokens`` (at most that), which the router never sees.
        """
        return Request(request_id, arrival.prompt_tokens, arrival.max_tokens, arrival=arrival.time)

    def _busy(self) -> bool:
        return self._pending is not None or any(
            core.running or len(core.queue) for core in self.cores
        )

    def _push(self, t: float, kind: int, index: int) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, index))

    def _next_arrival(self, source: Iterator[Arrival]) -> None:
        self._pending = next(source, None)
        if self._pending is not None:
            self._push(self._pending.time, ARRIVAL, 0)

    def _arrive(self, source: Iterator[Arrival], duration_s: float) -> None:
        arrival = self._pending
        assert arrival is not None
        if arrival.time < duration_s:
            rid = f"s{len(self._records)}"
            k = self._balancer.pick() if len(self.cores) > 1 else 0
            self._records[rid] = _Record(arrival.time, arrival.output_tokens, router=k)
            self.cores[k].submit(self.make_request(rid, arrival))
            self._next_arrival(source)
        else:
            self._pending = None

    def _kick(self, i: int) -> None:
        duration = self.engines[i].start_step()
        self._stepping[i] = duration > 0
        if duration > 0:
            self._push(self.clock.now + duration, STEP, i)

    def _step_done(self, i: int) -> None:
        self._stepping[i] = False
        out = self.engines[i].finish_step()
        for seq in out.first_tokens:
            a = self._live.get(seq.id)
            if a is not None:
                self._records[seq.id].first_token = self.clock.now
                self.cores[self._owner(a)].first_byte(a)
        for seq in out.finished:
            a = self._live.pop(seq.id, None)
            if a is not None:
                self._records[seq.id].output_tokens = seq.output_tokens
                k = self._owner(a)
                self.cores[k].complete(a, seq.output_tokens)
                self.healths[k].success(a.replica)
        if not self._stepping[i]:
            self._kick(i)

    def _engine_metrics(self) -> None:
        """What the live poller reads from each engine's /metrics, and what it does then."""
        now = self.clock.now
        for i, (engine, fault) in enumerate(zip(self.engines, self._faults, strict=True)):
            if fault.dead:
                continue  # no answer: the last reading stays and ages, as live
            reading = EngineLoad(
                engine="vllm",
                received_at=now,
                waiting=len(engine.waiting),
                running=engine.running,
                kv_usage=engine.kv_usage,
                # vLLM's cache_config_info: whole blocks times the block size.
                kv_capacity_tokens=engine.kv_capacity // BLOCK_TOKENS * BLOCK_TOKENS,
                preemptions_total=engine.preemptions,
            )
            for core in self.cores:  # each router polls every engine itself
                r = core.pool.replicas[i]
                r.engine = reading
                core.pool.changed(r)
        for core in self.cores:
            core.engines_read()

    def _refused(self, a: Assignment, reason: str) -> None:
        """The engine answered 400 before any token: as the live proxy takes such an answer
        (relayed to the client, the replica not blamed, the request not retried)."""
        k = self._owner(a)
        core = self.cores[k]
        if core.running.get(a.request.id) is not a:
            return
        self.healths[k].success(a.replica)
        core.first_byte(a)
        core.fail(a, reason, retryable=False)

    # ---- faults (as EmulatedFleet sets them on live replicas) ------------------------------

    def kill(self, replica_id: str) -> None:
        """The replica's server dies: its attempts fail now, new ones are refused."""
        i = self.core.replica(replica_id).index
        self._faults[i].dead = True
        victims = [a for a in self._live.values() if a.replica.index == i]
        for a in victims:
            del self._live[a.request.id]
            self.engines[i].cancel(a.request.id)
        for a in victims:
            self._attempt_failed(a, f"{replica_id}: connection reset (replica killed)")

    def revive(self, replica_id: str) -> None:
        """Back to normal, every fault undone (the health monitor readmits it in time)."""
        i = self.core.replica(replica_id).index
        self._faults[i] = _Fault()
        self.engines[i].cost = self._base_costs[i]

    heal = revive

    def slow(self, replica_id: str, factor: float, version: str | None = None) -> None:
        """Every engine step of the replica takes ``factor`` times as long; given a
        ``version``, only while the replica serves it (its ``fail_fraction`` becomes that
        version's too: one version a fault stands for, as the emulator's)."""
        if not factor > 0:
            raise ValueError(f"a slow-down factor must be > 0, got {factor}")
        i = self.core.replica(replica_id).index
        self._faults[i].slow_factor = factor
        self._faults[i].of_version = version
        self._set_cost(i)

    def fail_fraction(self, replica_id: str, fraction: float, version: str | None = None) -> None:
        """The replica answers 500 to ``fraction`` of the attempts sent to it; given a
        ``version``, only while it serves it (its ``slow`` becomes that version's too)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"a failing fraction must be between 0 and 1, got {fraction}")
        i = self.core.replica(replica_id).index
        self._faults[i].fail_fraction = fraction
        self._faults[i].of_version = version
        self._set_cost(i)

    def switch_version(self, replica_id: str, version: str, aliases: tuple[str, ...] = ()) -> None:
        """The replica's engine now serves ``version`` (and ``aliases``), as the emulator's
        version switch leaves it once loaded; faults set for a version follow what it serves.
        Taking it out of service meanwhile is the caller's (a rollout drains it first)."""
        i = self.core.replica(replica_id).index
        self.served[i] = tuple(dict.fromkeys((version, *aliases)))
        self._set_cost(i)

    def _version_faults_apply(self, i: int) -> bool:
        of = self._faults[i].of_version
        return of is None or of == self.served[i][0]

    def _set_cost(self, i: int) -> None:
        base = self._base_costs[i]
        factor = self._faults[i].slow_factor if self._version_faults_apply(i) else 1.0
        if factor == 1:
            self.engines[i].cost = base
            return

        def slowed(prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
            return factor * base(prefill_tokens, decode_seqs, decode_context_tokens)

        self.engines[i].cost = slowed

    def _failure(self, i: int) -> str | None:
        fault = self._faults[i]
        if fault.dead:
            return "connection refused (replica killed)"
        if not self._version_faults_apply(i):
            return None
        if self._fault_rng.random() < fault.fail_fraction:
            return "answered 500 (injected failure)"
        return None

    def _attempt_failed(self, a: Assignment, reason: str) -> None:
        # As the proxy does: the core retries or fails it, the health monitor counts it.
        k = self._owner(a)
        if self.cores[k].running.get(a.request.id) is not a:
            return
        self.cores[k].fail(a, reason)
        self.healths[k].failure(a.replica, reason)

    def _next_readmit_probe(self, k: int, i: int, ejection: Ejection) -> None:
        """As the live monitor probes an ejected replica: at every check during its window
        (the live checks run on one fleet-wide timer; here every ``check_interval_s`` from the
        ejection), and when the window ends."""
        interval = self.healths[k].config.check_interval_s
        at = ejection.until
        if interval > 0:
            at = min(at, self.clock.now + interval)
        self.at(at, lambda: self._readmit_probe(k, i, ejection))

    def _readmit_probe(self, k: int, i: int, ejection: Ejection) -> None:
        """A readmission probe (router ``k``'s): back in service if the server is up."""
        health = self.healths[k]
        if health.ejections.get(i) is not ejection:
            return  # readmitted meanwhile (and perhaps ejected again: that one has its own)
        problem = "connection refused (replica killed)" if self._faults[i].dead else None
        health.readmission_verdict(i, problem)
        if health.ejections.get(i) is ejection:
            self._next_readmit_probe(k, i, ejection)

    # ---- results ---------------------------------------------------------------------------

    def _result(self, duration_s: float) -> SimResult:
        recs = list(self._records.values())
        by = {o: sum(1 for r in recs if r.outcome is o) for o in Outcome}
        unfinished = sum(len(core.running) + len(core.queue) for core in self.cores)
        done = [r for r in recs if r.outcome is Outcome.COMPLETED]
        # Throughput is read in steady state: after a warm-up fifth of the run, before the end.
        start = WARMUP_SHARE * duration_s
        in_window = [r for r in done if r.end is not None and start < r.end <= duration_s]
        window = duration_s - start
        # A request that never produced a token waited longer than any that did.
        ttft = [
            (r.first_token - r.arrival) if r.first_token is not None else math.inf
            for r in recs
            if r.outcome in (Outcome.COMPLETED, Outcome.EXPIRED, None)
        ]
        e2e = [r.end - r.arrival for r in done if r.end is not None]
        served: dict[str | None, int] = {}
        for r in in_window:
            served[r.replica] = served.get(r.replica, 0) + 1
        replicas = tuple(
            self._replica_result(i, served.get(rep.id, 0), window)
            for i, rep in enumerate(self.core.pool)
        )
        return SimResult(
            strategy=self.core.strategy.name,
            duration_s=duration_s,
            offered=len(recs),
            completed=by[Outcome.COMPLETED],
            failed=by[Outcome.FAILED],
            rejected=by[Outcome.REJECTED],
            expired=by[Outcome.EXPIRED],
            unfinished=unfinished,
            lost_requests=len(recs) - sum(by.values()) - unfinished,
            throughput_rps=len(in_window) / window,
            output_tokens_per_s=sum(r.output_tokens for r in in_window) / window,
            ttft_p50_s=percentile(ttft, 0.5),
            ttft_p99_s=percentile(ttft, 0.99),
            e2e_p50_s=percentile(e2e, 0.5),
            e2e_p99_s=percentile(e2e, 0.99),
            replicas=replicas,
        )

    def _replica_result(self, i: int, completed: int, window_s: float) -> ReplicaResult:
        r = self.core.pool.replicas[i]
        engine = self.engines[i]
        capacity = self.capacities.get(r.id, 0.0)
        rps = completed / window_s
        (load,) = capacity_loads([self._dispatched[i]], [self._held[i]], [r.speed], window_s)
        return ReplicaResult(
            id=r.id,
            gpu_model=r.config.gpu_model,
            completed=completed,
            throughput_rps=rps,
            capacity_rps=capacity,
            utilization=load,
            busy_fraction=min(1.0, engine.busy_seconds / self._duration),
            preemptions=engine.preemptions,
        )


def _first_served(config: ReplicaConfig) -> tuple[str, ...]:
    """What a replica's engine lists at the start, as the emulator does: the fleet file's
    ``version`` (else its ``model``) first, then the ``model`` as an alias."""
    version = config.version or config.model
    return (version,) if version == config.model else (version, config.model)


def _longest_request(replica: Replica, engine: Engine, catalog: ProfileCatalog) -> int:
    """The longest request (prompt plus ``max_tokens``) a replica's engine accepts, by the
    emulator's rule (``EmulatedReplica.plan``): within the context (the fleet file's, else the
    model's own) and within the KV cache less the 1% watermark an empty engine keeps free."""
    config = replica.config
    context = config.max_context_tokens or deployment_for(config, catalog).model.max_context_tokens
    kv = engine.kv_capacity - engine.kv_capacity // 100
    return min(context, kv)
