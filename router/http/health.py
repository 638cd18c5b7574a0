"""Replica health: passive outlier ejection, active health checks, and probe readmission.

- **Passive**: the proxy reports every attempt that failed because of the replica (connect
  error, timeout, 5xx, a connection cut) and every success. ``eject_after_failures`` failures
  in a row make the replica unhealthy: it is ejected (``core.eject`` with the reason) within
  the limits below.
- **Active**: every ``check_interval_s`` each replica in service is probed
  (``GET check_path``, ``check_timeout_s``); as many failed probes in a row eject it too.
- **Silence** (router/http/silence.py): a stream that relayed nothing for longer than its
  replica's idle limit (learned from the gaps between its chunks, at most
  ``stream_idle_max_s``), or a replica that holds work and sent nothing for that long, makes
  the replica a suspect: it is probed at once with a real generation (a one-token
  completion of its model). A frozen engine answers ``/health`` in a millisecond, so only a
  generation tells. Silence alone ends nothing: a slow card's full-budget prefill step
  silences every stream on it for seconds. The probe has the verdict window (two of the
  replica's longest plausible steps, at least ``check_timeout_s``); a replica that generates
  within it, or is heard from meanwhile, is working and keeps every stream. One that does
  neither is stuck: it is ejected (cause ``silence``) and every attempt on it is stopped:
  the ones that have sent nothing to their client are re-run on another replica, the
  streams end with an error event.
- **Readmission**: an ejection lasts ``eject_base_s`` at most, doubled for each ejection in a
  row (up to ``eject_max_s``). An ejected replica is probed with a generation at every active
  check during its window and when the window ends: a replica that generates is readmitted at
  once (a killed replica that restarted is back within a check interval), one that does not
  stays out; a failed probe at the window's end starts the next, longer window. A replica
  that stays in service for ``eject_max_s`` starts again from the base window.
- **Limits** (router/http/ejection_limits.py): a replica the monitor judges unhealthy is
  ejected only while fewer than ``max_ejection_percent`` of the replicas in service are out;
  beyond that it stays in service, still counted unhealthy. When fewer than
  ``panic_threshold_percent`` are healthy, **panic mode**: every ejected replica is readmitted
  and none is ejected, so requests go to every replica in service, until enough are healthy
  again; then the ones still judged unhealthy are ejected, within the limit. Panic is logged
  (a warning), an event in the audit trail, ``core.panic`` (the snapshot, the admin state,
  /metrics, the console). A replica stops being judged unhealthy on evidence that answers its
  verdict: a request it completed or a generation probe, or (for a failed health check only)
  a health check that passes. So a replica kept in service though judged unhealthy for
  failed requests or silence gets a generation at each active check instead of ``/health``:
  with no traffic, panic mode would otherwise outlast the outage.
- Otherwise the periodic check asks ``check_path`` (``/health``), not for a generation. A generation
  every interval would cost little, but it finds nothing the silence watch misses: a frozen
  replica that holds work goes silent and is probed within its idle limit, and one that holds
  none harms no request until one is sent to it, which then goes unanswered just as long. The
  cheap check still finds what the watch cannot see on an idle replica: a dead or hung server.

Only replicas this monitor ejected are readmitted by it: an operator's ejection stays until
the operator readmits. Ejections are visible in the replica's state, in ``status()`` (the
admin API's ``health`` section) and in the ``gpurouter_ejections_total`` metric.

- **Answering**: ejection waits for several failures in a row, but the latest request or probe
  already says whether a replica answers. A replica in service whose latest one failed cannot
  be counted on to take a request, so ``/ready`` (``readiness()``) leaves it out: a router
  with nothing behind its endpoints is not ready from the first failed probe, not only once
  every replica has been ejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.config.schema import HealthConfig
from router.core import CoreListener, RouterCore
from router.errors import ControlError, GpuRouterError
from router.http.ejection_limits import FleetHealth
from router.http.silence import FULL_STEP_TOKENS, SilenceWatch
from router.perf.model import Deployment, batch_step_function
from router.replica import Replica, ReplicaState

__all__ = ["Ejection", "Generate", "HealthMonitor", "Probe", "Verdict"]

Probe = Callable[[str, float], Awaitable[str | None]]
"""``probe(url, timeout_s)``: None when the replica answered well, else what went wrong."""
Generate = Callable[[str, str, float], Awaitable[str | None]]
"""``generate(url, model, timeout_s)``: None when the replica generated a token in time."""

_BUSY = "a probe is already running"

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Verdict:
    """Why the monitor judges a replica unhealthy, ejected or not."""

    reason: str
    cause: str
    """``failures``, ``health_check`` or ``silence`` (as :attr:`Ejection.cause`)."""


@dataclass(slots=True)
class Ejection:
    """Why and until when the monitor keeps a replica out."""

    reason: str
    cause: str
    """``failures`` (passive), ``health_check`` (active) or ``silence`` (a silent replica
    that a generation probe found stuck)."""
    until: float
    """When the window ends: a readmission probe then, if none readmitted it before."""
    in_row: int
    """Ejections in a row, this one included: the window is ``base * 2 ** (in_row - 1)``."""
    probe: str | None = None
    """What the latest readmission probe found wrong (None: none has run yet)."""


class HealthMonitor(CoreListener):
    def __init__(
        self,
        core: RouterCore,
        config: HealthConfig,
        probe: Probe | None = None,
        *,
        generate: Generate | None = None,
    ) -> None:
        """``generate``: the probe after a silence and for readmission; without it ``probe``
        (``GET check_path``) serves for both."""
        self.core = core
        self.config = config
        self.clock = core.clock
        self._probe = probe
        self._generate = generate
        n = len(core.pool)
        self.silence = SilenceWatch(n, config.stream_idle_max_s)
        """The attempts in flight, their replicas' idle limits; the proxy reports to it."""
        self.silence.modelled_step_s = [_full_step_s(core, r) for r in core.pool]
        self.failures = [0] * n
        """Consecutive failed requests per replica index."""
        self.probe_failures = [0] * n
        self.unhealthy: dict[int, Verdict] = {}
        """Replicas this monitor judges unhealthy, by index: every one it ejected, and those
        the limits keep in service (router/http/ejection_limits.py)."""
        self.ejections: dict[int, Ejection] = {}
        """Replicas this monitor ejected and keeps out, by index."""
        self.ejections_total: Counter[tuple[str, str]] = Counter()
        """(replica id, cause) -> ejections, for metrics."""
        self.answered: list[bool | None] = [None] * n
        """Per replica index: whether its latest request or probe went well (None: none yet)."""
        self._in_row = [0] * n
        self._back_since = [0.0] * n
        self._probing: set[int] = set()
        self._next_check = 0.0
        self._settling = False
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._suspected: set[int] = set()
        self._probes: set[asyncio.Task[None]] = set()
        core.listeners.append(self)

    # ---- passive --------------------------------------------------------------------------

    def success(self, replica: Replica) -> None:
        self.failures[replica.index] = 0
        self.answered[replica.index] = True
        if replica.index in self.unhealthy:
            self._recovered(replica.index, generated=True)

    def failure(self, replica: Replica, reason: str) -> None:
        i = replica.index
        self.failures[i] += 1
        self.answered[i] = False
        limit = self.config.eject_after_failures
        if limit and self.failures[i] >= limit and replica.state is ReplicaState.ACTIVE:
            self._condemn(
                replica, f"{self.failures[i]} failed requests in a row: {reason}", "failures"
            )

    # ---- judgement, ejection and its limits -----------------------------------------------

    def _condemn(self, r: Replica, reason: str, cause: str) -> None:
        """Judge a replica in service unhealthy: ejected if the limits allow, else kept."""
        new = r.index not in self.unhealthy
        self.unhealthy[r.index] = Verdict(reason, cause)
        self._settle()
        if new and r.state is ReplicaState.ACTIVE:
            why = "panic mode" if self.core.panic is not None else self._limit_text()
            log.warning("%s is unhealthy (%s) but stays in service: %s", r.id, reason, why)

    def _recovered(self, i: int, *, generated: bool) -> None:
        """Evidence that a replica works: it generated (a request it completed, a generation
        probe), or it passed a health check, which answers only a failed health check. An
        ejected replica comes back through its readmission probe alone."""
        verdict = self.unhealthy.get(i)
        if verdict is None or i in self.ejections:
            return
        if generated or verdict.cause == "health_check":
            del self.unhealthy[i]
            self._settle()

    def fleet_health(self) -> FleetHealth:
        """The replicas in service (active, or ejected by this monitor) and how many of them
        are healthy."""
        in_service = [
            r.index
            for r in self.core.pool
            if r.state is ReplicaState.ACTIVE or r.index in self.ejections
        ]
        healthy = sum(i not in self.unhealthy for i in in_service)
        return FleetHealth(len(in_service), healthy)

    def _settle(self) -> None:
        """Bring ejections in line with the judgements and the limits: in panic, readmit
        every ejected replica; else eject the unhealthy ones in service while the maximum
        ejected share allows. One pass is enough: neither changes how many are in service
        or healthy."""
        if self._settling:
            return  # our own ejection or readmission, told back to us by the core
        self._settling = True
        try:
            fleet, c = self.fleet_health(), self.config
            threshold = c.panic_threshold_percent
            if fleet.panic(threshold):
                self._panic(fleet.describe(threshold))
                return
            if self.core.panic is not None:
                reason = fleet.describe(threshold)
                log.warning("panic over: %s; routing by health again", reason)
                self.core.set_panic(False, reason)
            allowed = fleet.max_ejected(c.max_ejection_percent)
            for i, verdict in list(self.unhealthy.items()):
                r = self.core.pool.replicas[i]
                if len(self.ejections) >= allowed:
                    break
                if r.state is ReplicaState.ACTIVE and i not in self.ejections:
                    self._eject(r, verdict.reason, verdict.cause)
        finally:
            self._settling = False

    def _panic(self, reason: str) -> None:
        if self.core.panic is None:
            log.warning("PANIC: %s; routing to every replica in service", reason)
        self.core.set_panic(True, reason)
        for i in list(self.ejections):
            with contextlib.suppress(ControlError):
                self.core.readmit(self.core.pool.replicas[i].id, f"panic mode: {reason}")

    def _limit_text(self) -> str:
        fleet, pct = self.fleet_health(), self.config.max_ejection_percent
        allowed = fleet.max_ejected(pct)
        return (
            f"{len(self.ejections)} of {fleet.in_service} in service already ejected, "
            f"at most {allowed} may be (max_ejection_percent {pct:g})"
        )

    def _eject(self, r: Replica, reason: str, cause: str) -> None:
        now = self.clock()
        i = r.index
        if self._in_row[i] and now - self._back_since[i] >= self.config.eject_max_s:
            self._in_row[i] = 0  # it served long enough since its last ejection: forgiven
        self._in_row[i] += 1
        self.ejections[i] = Ejection(reason, cause, now + self._window(i), self._in_row[i])
        self.ejections_total[(r.id, cause)] += 1
        self.failures[i] = self.probe_failures[i] = 0
        try:
            self.core.eject(r.id, reason)
        except ControlError:
            self.ejections.pop(i, None)  # already out (an operator was quicker)
            return
        log.info("%s ejected (%s)", r.id, reason)

    def _window(self, i: int) -> float:
        c = self.config
        return float(min(c.eject_base_s * 2 ** (self._in_row[i] - 1), c.eject_max_s))

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        i = replica.index
        if replica.state is not ReplicaState.EJECTED and i in self.ejections:
            # Readmitted, by us or by an operator: it is back in service from now.
            del self.ejections[i]
            self._back_since[i] = self.clock()
            self.failures[i] = self.probe_failures[i] = 0
        if self._settling:
            return  # our own change (a panic's readmission, an ejection)
        if old is ReplicaState.EJECTED and replica.state is ReplicaState.ACTIVE:
            self.unhealthy.pop(i, None)  # readmitted by a probe that generated, or an operator
        self._settle()  # an operator's drain or readmission changes what is in service

    def readmission_verdict(self, i: int, problem: str | None) -> None:
        """What a readmission probe of ejected replica ``i`` found (None: it generated):
        readmitted, or kept out (for a longer window if its window has ended)."""
        r = self.core.pool.replicas[i]
        ejection = self.ejections.get(i)
        if ejection is None or r.state is not ReplicaState.EJECTED:
            return  # readmitted meanwhile (an operator, panic mode)
        now = self.clock()
        self.answered[i] = problem is None
        if problem is None:
            self.silence.heard_from(i, now)
            with contextlib.suppress(ControlError):
                self.core.readmit(r.id, "a generation probe answered")
            return
        ejection.probe = problem
        if ejection.until <= now:
            self._in_row[i] += 1
            ejection.in_row = self._in_row[i]
            ejection.until = now + self._window(i)

    def next_probe_at(self, i: int) -> float:
        """When ejected replica ``i`` is probed next: the next active check, else when its
        window ends."""
        until = self.ejections[i].until
        return min(until, self._next_check) if self.config.check_interval_s > 0 else until

    # ---- the loop: readmission probes and active checks -----------------------------------

    def start(self, probe: Probe | None = None) -> None:
        if probe is not None:
            self._probe = probe
        if self._probe is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="router-health")
        if self.silence.enabled and self._watch is None:
            self._watch = asyncio.create_task(self._watch_silence(), name="router-silence")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._watch) if t is not None] + list(self._probes)
        self._task = self._watch = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def tick_s(self) -> float:
        c = self.config
        candidates = [0.5, c.eject_base_s / 4]
        if c.check_interval_s > 0:
            candidates.append(c.check_interval_s)
        return max(0.01, min(candidates))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.round()

    async def round(self) -> None:
        """One pass: when a check is due, probe every replica (the ejected ones with a
        generation, for readmission); else probe the ejected replicas whose window ended."""
        now = self.clock()
        interval = self.config.check_interval_s
        due = interval > 0 and now >= self._next_check
        if due:
            self._next_check = now + interval
        jobs: list[Awaitable[None]] = [
            self._readmit_probe(i) for i, e in self.ejections.items() if due or e.until <= now
        ]
        if due:
            jobs += self._checks()
        if jobs:
            await asyncio.gather(*jobs)

    async def check(self) -> None:
        """Probe every replica in service now, whatever the interval."""
        await asyncio.gather(*self._checks())

    def _checks(self) -> list[Awaitable[None]]:
        return [
            self._check(r)
            for r in self.core.pool
            if r.state is not ReplicaState.EJECTED and r.index not in self.ejections
        ]

    def _url(self, r: Replica) -> str:
        return r.config.endpoint.rstrip("/") + self.config.check_path

    async def _ask(
        self, r: Replica, *, generate: bool = False, timeout_s: float | None = None
    ) -> str | None:
        """Probe the replica: a generation when asked for and possible, else its health;
        within ``timeout_s`` (by default ``check_timeout_s``)."""
        i = r.index
        if i in self._probing:
            return _BUSY
        self._probing.add(i)
        try:
            timeout = self.config.check_timeout_s if timeout_s is None else timeout_s
            base = r.config.endpoint.rstrip("/")
            if generate and self._generate is not None:
                return await self._generate(base + "/v1/completions", _model_of(r), timeout)
            assert self._probe is not None
            return await self._probe(self._url(r), timeout)
        finally:
            self._probing.discard(i)

    async def _readmit_probe(self, i: int) -> None:
        r = self.core.pool.replicas[i]
        # A generation, not /health: a frozen engine answers /health and generates nothing.
        problem = await self._ask(r, generate=True)
        if problem != _BUSY:
            self.readmission_verdict(i, problem)

    async def _check(self, r: Replica) -> None:
        i = r.index
        # A replica kept in service though judged unhealthy (panic mode, the ejection limit)
        # for what /health cannot show (failed requests, silence) gets a generation: else,
        # with no traffic to complete a request, nothing would ever clear it.
        verdict = self.unhealthy.get(i)
        generate = verdict is not None and verdict.cause != "health_check"
        problem = await self._ask(r, generate=generate)
        if problem == _BUSY:
            return
        self.answered[i] = problem is None
        if problem is None:
            self.probe_failures[i] = 0
            self._recovered(i, generated=generate)
            return
        if generate:
            return  # already judged, on evidence /health cannot clear: keep that verdict
        self.probe_failures[i] += 1
        limit = self.config.eject_after_failures
        if limit and self.probe_failures[i] >= limit and r.state is ReplicaState.ACTIVE:
            self._condemn(
                r, f"{self.probe_failures[i]} failed health checks: {problem}", "health_check"
            )

    # ---- silence ---------------------------------------------------------------------------

    @property
    def silence_tick_s(self) -> float:
        """How often the watch looks: a tenth of the ceiling, between 20 and 250 ms."""
        return max(0.02, min(0.25, self.config.stream_idle_max_s / 10))

    async def _watch_silence(self) -> None:
        while True:
            await asyncio.sleep(self.silence_tick_s)
            self.look_for_silence()

    def look_for_silence(self) -> None:
        """Probe the replicas that are silent, or hold a stream silent past their idle
        limit. Nothing is stopped here: only the probe's verdict may do that."""
        found = self.silence.sweep(self.clock())
        replicas = self.core.pool.replicas
        suspects: dict[int, float] = dict(found.silent_replicas)
        for i, _, silent_s in found.silent_streams:
            suspects[i] = max(suspects.get(i, 0.0), silent_s)
        for i, silent_s in suspects.items():
            self._suspect(replicas[i], silent_s)

    def verdict_window_s(self, r: Replica) -> float:
        """How long the probe of a silent replica may take (router/http/silence.py)."""
        calibration = self.core.capacity.calibration
        now = self.clock()
        return self.silence.verdict_window_s(r.index, now, self.config.check_timeout_s, calibration)

    def _suspect(self, r: Replica, silent_s: float) -> None:
        # Without ejection (eject_after_failures: 0) a probe could change nothing.
        if not self.config.eject_after_failures or r.index in self._suspected:
            return
        if self._generate is None and self._probe is None:
            return
        self._suspected.add(r.index)
        task = asyncio.get_running_loop().create_task(self._silence_probe(r, silent_s))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _silence_probe(self, r: Replica, silent_s: float) -> None:
        i = r.index
        heard, silent_since = self.silence.heard[i], self.clock() - silent_s
        window = self.verdict_window_s(r)
        try:
            problem = await self._ask(r, generate=True, timeout_s=window)
        finally:
            self._suspected.discard(i)
        if problem == _BUSY:
            return
        if self.silence.heard[i] > heard:
            problem = None  # it spoke while the probe waited (for a free slot, say): working
        self.answered[i] = problem is None
        if problem is None:
            self.silence.working(i, self.clock())  # slow, not stuck: it keeps every stream
            if i in self.unhealthy:
                self._recovered(i, generated=True)
            return
        reason = f"silent for {self.clock() - silent_since:.1f} s; {problem}"
        if r.state is ReplicaState.ACTIVE:
            self._condemn(r, reason, "silence")
        # Requests that sent nothing to their client yet are re-run elsewhere; streams end.
        self.silence.interrupt_all(i, f"{r.id}: {reason}")

    # ---- for readers ----------------------------------------------------------------------

    def answering(self, r: Replica) -> bool:
        """In service, and its latest request or probe, if any, went well."""
        return r.state is ReplicaState.ACTIVE and self.answered[r.index] is not False

    def failing(self) -> frozenset[str]:
        """Replicas whose latest request or probe failed, whatever their state."""
        return frozenset(r.id for r in self.core.pool if self.answered[r.index] is False)

    def readiness(self) -> dict[str, object]:
        """``/ready``'s answer: ready while at least one replica in service answers."""
        pool = self.core.pool
        active = sum(r.state is ReplicaState.ACTIVE for r in pool)
        answering = sum(self.answering(r) for r in pool)
        return {"ready": answering > 0, "active": active, "answering": answering}

    def status(self) -> dict[str, object]:
        """Per replica: failures in a row, its idle limit and its probe's verdict window
        now, the verdict if this monitor judges it unhealthy (with why it stays in service
        when it does), and the ejection if this monitor holds one."""
        now = self.clock()
        out: dict[str, object] = {}
        for r in self.core.pool:
            out[r.id] = {
                "failures_in_row": self.failures[r.index],
                "failed_checks_in_row": self.probe_failures[r.index],
                "answered": self.answered[r.index],
                "idle_limit_s": self.silence.limit_s(r.index, now),
                "verdict_window_s": self.verdict_window_s(r),
                "unhealthy": self._unhealthy_status(r),
                "ejection": self._ejection_status(r.index, now),
            }
        return out

    def _unhealthy_status(self, r: Replica) -> dict[str, object] | None:
        v = self.unhealthy.get(r.index)
        if v is None:
            return None
        kept = None
        if r.state is ReplicaState.ACTIVE:
            kept = "panic mode" if self.core.panic is not None else self._limit_text()
        return {"reason": v.reason, "cause": v.cause, "kept_in_service": kept}

    def _ejection_status(self, i: int, now: float) -> dict[str, object] | None:
        e = self.ejections.get(i)
        if e is None:
            return None
        return {
            "reason": e.reason,
            "cause": e.cause,
            "remaining_s": max(0.0, e.until - now),
            "next_probe_s": max(0.0, self.next_probe_at(i) - now),
            "last_probe": e.probe,
            "in_row": e.in_row,
        }


def _full_step_s(core: RouterCore, r: Replica) -> float:
    """The performance model's seconds for a step that prefills a full budget on the
    replica's card and model; 0 where the model knows neither (a CPU engine, say)."""
    catalog = core.capacity.catalog
    try:
        deployment = Deployment(
            gpu=catalog.gpu(r.config.gpu_model),
            model=catalog.model(r.config.model),
            tensor_parallel=max(1, len(r.config.gpus)),
        )
    except (GpuRouterError, ValueError):
        return 0.0
    return batch_step_function(deployment)(FULL_STEP_TOKENS, 0, 0)


def _model_of(r: Replica) -> str:
    """The model a generation probe asks the replica for: one it said it serves."""
    return r.models[0] if r.models else r.config.model
