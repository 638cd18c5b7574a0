"""Whether the attached router answers, and when to ask it again.

Pure state on an injected clock: the poller reports each answer or failure, the event stream
each restart of the router, the console reads :meth:`Link.line` for its header and
:meth:`Link.changed` for its events pane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from console.view.format import duration

__all__ = ["Backoff", "Link"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits between tries after failures in a row: first, first * factor, ..., at most."""

    first_s: float = 0.5
    factor: float = 2.0
    most_s: float = 10.0

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failure in a row (1 is the first)."""
        if failures < 1:
            return 0.0
        return min(self.most_s, self.first_s * self.factor ** (failures - 1))


class Link:
    """The connection to one admin API, as the operator is told about it."""

    def __init__(
        self, url: str, clock: Callable[[], float], backoff: Backoff | None = None
    ) -> None:
        self.url = url
        self.clock = clock
        self.backoff = backoff or Backoff()
        self.failures = 0
        """Failures in a row; 0 while the router answers."""
        self.reason: str | None = None
        self.down_since: float | None = None
        self.retry_at: float | None = None
        self._told = True
        """Whether the operator was told of the latest change (up or down)."""
        self._restarts: list[str] = []
        """Runs the router began since the operator was last told (each a restart)."""

    @property
    def up(self) -> bool:
        return self.failures == 0

    def answered(self) -> None:
        """A call went through: the link is up (again)."""
        if not self.up:
            self._told = False
        self.failures, self.reason, self.down_since, self.retry_at = 0, None, None, None

    def failed(self, reason: str) -> float:
        """A call failed; the seconds to wait before the next try."""
        now = self.clock()
        if self.up:
            self.down_since, self._told = now, False
        self.failures += 1
        self.reason = reason
        wait = self.backoff.delay(self.failures)
        self.retry_at = now + wait
        return wait

    def restarted(self, run: str) -> None:
        """The router answers in a new run: it restarted, and numbers its events from 1."""
        self._restarts.append(run)

    def line(self) -> str | None:
        """``✖ disconnected 12s: <reason>; retrying in 3s`` while down; None while up."""
        if self.up or self.down_since is None:
            return None
        now = self.clock()
        retry = max(0.0, (self.retry_at or now) - now)
        return (
            f"✖ disconnected {duration(now - self.down_since)}: {self.reason}; "
            f"retrying in {duration(retry)}"
        )

    def changed(self) -> str | None:
        """Once per change: what to tell the operator (lost, back, or restarted: ask again
        until None, the link's own changes first); None otherwise."""
        if self._told:
            if self._restarts:
                run = self._restarts.pop(0)
                return f"router restarted: {self.url} numbers its events from 1 (run {run})"
            return None
        self._told = True
        if self.up:
            return f"reconnected to {self.url}"
        return f"lost {self.url}: {self.reason}"
