"""Replica health: passive outlier ejection, active health checks, and probe readmission.

- **Passive**: the proxy reports every attempt that failed because of the replica (connect
  error, timeout, 5xx, a connection cut) and every success. ``eject_after_failures`` failures
  in a row eject the replica (``core.eject`` with the reason).
- **Active**: every ``check_interval_s`` each replica in service is probed
  (``GET check_path``, ``check_timeout_s``); as many failed probes in a row eject it too.
- **Readmission**: an ejection lasts ``eject_base_s``, doubled for each ejection in a row (up
  to ``eject_max_s``); when it ends a probe decides: a good answer readmits the replica, a bad
  one keeps it out for the next, longer window. A replica that stays in service for
  ``eject_max_s`` starts again from the base window.

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
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.config.schema import HealthConfig
from router.core import CoreListener, RouterCore
from router.errors import ControlError
from router.replica import Replica, ReplicaState

__all__ = ["Ejection", "HealthMonitor", "Probe"]

Probe = Callable[[str, float], Awaitable[str | None]]
"""``probe(url, timeout_s)``: None when the replica answered well, else what went wrong."""


@dataclass(slots=True)
class Ejection:
    """Why and until when the monitor keeps a replica out."""

    reason: str
    cause: str
    """``failures`` (passive) or ``health_check`` (active)."""
    until: float
    in_row: int
    """Ejections in a row, this one included: the window is ``base * 2 ** (in_row - 1)``."""


class HealthMonitor(CoreListener):
    def __init__(
        self,
        core: RouterCore,
        config: HealthConfig,
        probe: Probe | None = None,
    ) -> None:
        self.core = core
        self.config = config
        self.clock = core.clock
        self._probe = probe
        n = len(core.pool)
        self.failures = [0] * n
        """Consecutive failed requests per replica index."""
        self.probe_failures = [0] * n
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
        self._task: asyncio.Task[None] | None = None
        core.listeners.append(self)

    # ---- passive --------------------------------------------------------------------------

    def success(self, replica: Replica) -> None:
        self.failures[replica.index] = 0
        self.answered[replica.index] = True

    def failure(self, replica: Replica, reason: str) -> None:
        i = replica.index
        self.failures[i] += 1
        self.answered[i] = False
        limit = self.config.eject_after_failures
        if limit and self.failures[i] >= limit and replica.state is ReplicaState.ACTIVE:
            self._eject(
                replica, f"{self.failures[i]} failed requests in a row: {reason}", "failures"
            )

    # ---- ejection and readmission ---------------------------------------------------------

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

    def _window(self, i: int) -> float:
        c = self.config
        return float(min(c.eject_base_s * 2 ** (self._in_row[i] - 1), c.eject_max_s))

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        if replica.state is not ReplicaState.EJECTED and replica.index in self.ejections:
            # Readmitted, by us or by an operator: it is back in service from now.
            del self.ejections[replica.index]
            self._back_since[replica.index] = self.clock()
            self.failures[replica.index] = self.probe_failures[replica.index] = 0

    # ---- the loop: readmission probes and active checks -----------------------------------

    def start(self, probe: Probe | None = None) -> None:
        if probe is not None:
            self._probe = probe
        if self._probe is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="router-health")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
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
        """One pass: probe replicas whose ejection ended, and (when due) the ones in service."""
        now = self.clock()
        jobs: list[Awaitable[None]] = [
            self._readmit_probe(i) for i, e in self.ejections.items() if e.until <= now
        ]
        interval = self.config.check_interval_s
        if interval > 0 and now >= self._next_check:
            self._next_check = now + interval
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

    async def _ask(self, r: Replica) -> str | None:
        assert self._probe is not None
        i = r.index
        if i in self._probing:
            return "a probe is already running"
        self._probing.add(i)
        try:
            return await self._probe(self._url(r), self.config.check_timeout_s)
        finally:
            self._probing.discard(i)

    async def _readmit_probe(self, i: int) -> None:
        r = self.core.pool.replicas[i]
        problem = await self._ask(r)
        ejection = self.ejections.get(i)
        if ejection is None or r.state is not ReplicaState.EJECTED:
            return  # readmitted by an operator meanwhile
        self.answered[i] = problem is None
        if problem is None:
            with contextlib.suppress(ControlError):
                self.core.readmit(r.id)
            return
        self._in_row[i] += 1
        ejection.in_row = self._in_row[i]
        ejection.until = self.clock() + self._window(i)
        ejection.reason = f"still failing: {problem}"

    async def _check(self, r: Replica) -> None:
        problem = await self._ask(r)
        i = r.index
        if problem == "a probe is already running":
            return
        self.answered[i] = problem is None
        if problem is None:
            self.probe_failures[i] = 0
            return
        self.probe_failures[i] += 1
        limit = self.config.eject_after_failures
        if limit and self.probe_failures[i] >= limit and r.state is ReplicaState.ACTIVE:
            self._eject(
                r, f"{self.probe_failures[i]} failed health checks: {problem}", "health_check"
            )

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
        """Per replica: failures in a row, and the ejection if this monitor holds one."""
        now = self.clock()
        out: dict[str, object] = {}
        for r in self.core.pool:
            e = self.ejections.get(r.index)
            out[r.id] = {
                "failures_in_row": self.failures[r.index],
                "failed_checks_in_row": self.probe_failures[r.index],
                "answered": self.answered[r.index],
                "ejection": None
                if e is None
                else {
                    "reason": e.reason,
                    "cause": e.cause,
                    "remaining_s": max(0.0, e.until - now),
                    "in_row": e.in_row,
                },
            }
        return out
