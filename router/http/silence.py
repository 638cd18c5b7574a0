"""Silence on the data plane: how long a replica may go without a word while it holds work.

Silence makes a replica a *suspect*, never a culprit: an engine step that prefills a full
token budget (vLLM's default: 8192 tokens) takes seconds on a slow card (1.4-2.6 s modelled
for a 7-8B model on an L4, V100 or T4), and every stream on that replica is silent
meanwhile. So silence alone ends nothing: it starts a generation probe
(router/http/health.py), and only the probe's verdict that the replica is stuck ends its
streams.

A frozen engine (a hung GPU, a stuck collective: vLLM's engine core stopped) still answers
``/health`` in a millisecond, so only progress tells. The proxy already sees every chunk it
relays; this module keeps, per replica:

- the attempts waiting on it (each an :class:`Attempt`: when it started, whether its stream
  has begun, since when it waits for the next chunk);
- the gaps between chunks of its streams (the time the relay waited for the replica, not
  for the client), and from them its **idle limit**: ``GAP_FACTOR`` times the longest gap
  seen lately (a peak that halves every ``HALF_LIFE_S``), at least ``FLOOR_S``, at most the
  ceiling (``health.stream_idle_max_s``); a replica with no gaps observed yet gets the
  ceiling;
- when it was last heard from (a chunk, a whole answer, a probe that generated), and when a
  probe last found it working.

:meth:`SilenceWatch.sweep` says, at a given time, which streams have been silent past their
replica's limit (counted from the later of their last chunk and the replica's last verdict
of working: a request the engine preempted may sit silent on a replica that works, and is
not a new suspicion at every look) and which replicas are silent: holding work and heard
from by none of it for longer than the limit, counted from the later of the last word and
the oldest waiting attempt's start (a steady flow of new requests to a frozen replica does
not keep it looking alive). Health checking probes the replicas of both.

**The verdict's window** (:meth:`SilenceWatch.verdict_window_s`). A one-token generation on
a busy engine waits for the step in progress, then runs in the next step, which may itself
prefill a full budget: two of the replica's longest plausible steps (``VERDICT_STEPS``). The
longest plausible step is the larger of

- the longest gap between its chunks seen lately (the peak behind the idle limit): a step it
  was seen to take, on whatever card, at whatever slowdown;
- the performance model's time of a step that prefills a full budget (``FULL_STEP_TOKENS``)
  on its card and model, divided by the fleet's calibration (measured over modelled speed,
  router/capacity.py): what the card takes before it has been seen to take it, for example
  the first burst of long prompts after minutes of decoding. Unknown cards (the real-engine
  lab's CPUs) have none and rely on the gaps.

The window is never shorter than ``check_timeout_s``. A fixed number could not serve: the
longest step is 0.2 s on an H100 and 2.6 s on a T4, times any slowdown. While the probe
waits, any word from the replica (a chunk of any stream, a whole answer) is a verdict of
working too: a full batch makes the probe wait for a free slot, but the streams holding the
batch speak. The engine's own progress counters (vLLM's generation tokens) would say no more
during a long step, which advances none of them until it ends. They would tell one case the
chunks cannot: a full batch of long *non-streamed* requests says nothing until one of them
ends, so its probe may wait out the window for a slot and find a working replica stuck.

Everything here is plain data and arithmetic on times it is given: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "FLOOR_S",
    "FULL_STEP_TOKENS",
    "GAP_FACTOR",
    "HALF_LIFE_S",
    "VERDICT_STEPS",
    "Attempt",
    "IdleLimit",
    "SilenceWatch",
    "Sweep",
]

GAP_FACTOR = 3.0
"""How many times its longest recent gap a stream may stay silent."""
FLOOR_S = 1.5
"""No idle limit is shorter (unless the ceiling is): a burst of prefills beside the decodes
holds every stream of an engine for a moment (0.87 s measured on the lab's CPU engines at 64
concurrent streams, whose usual gap is 30 ms), before any such stall has been seen."""
HALF_LIFE_S = 60.0
"""The longest gap seen is remembered with this half-life: a replica that stalled a minute
ago may stall again; one that has flowed smoothly for minutes is held to its recent gaps."""

VERDICT_STEPS = 2.0
"""How many of its longest plausible steps a replica under suspicion gets to generate one
token: the step in progress, and the one the probe runs in."""
FULL_STEP_TOKENS = 8192
"""The tokens a step may prefill: vLLM's default budget (``max_num_batched_tokens``), the
emulator's too."""


class Attempt(Protocol):
    """What the watch reads of an attempt in flight, and how it stops one."""

    @property
    def started_at(self) -> float:
        """When the attempt was sent to the replica."""

    @property
    def streaming(self) -> bool:
        """Its stream has relayed a first chunk."""

    @property
    def waiting_since(self) -> float:
        """Since when it waits for the replica's next chunk (infinite while it writes to its
        client: a slow client is not a silent replica)."""

    def interrupt(self, reason: str) -> None:
        """Stop the attempt where it is, for ``reason``."""


class IdleLimit:
    """One replica's idle limit, learned from the gaps between its chunks: ``GAP_FACTOR``
    times the longest gap seen, decaying with ``HALF_LIFE_S``, within ``FLOOR_S`` and the
    ceiling.

    A peak, not a percentile: a busy replica relays thousands of chunks a second, so any
    window of gaps short enough to sort is a fraction of a second, and misses the rare stall
    that a limit must leave room for."""

    __slots__ = ("_at", "_peak", "ceiling_s")

    def __init__(self, ceiling_s: float) -> None:
        self.ceiling_s = ceiling_s
        self._peak: float | None = None
        self._at = 0.0

    def observe(self, gap_s: float, now: float) -> None:
        """One more gap between two chunks of a stream, ending at ``now``."""
        if self._peak is None or gap_s >= self.peak(now):
            self._peak, self._at = gap_s, now

    def peak(self, now: float) -> float:
        """The longest gap, decayed to ``now``; 0 before any."""
        if self._peak is None:
            return 0.0
        halvings = max(0.0, now - self._at) / HALF_LIFE_S
        return self._peak * math.pow(0.5, halvings)

    def limit_s(self, now: float) -> float:
        """The limit at ``now``: the ceiling until a gap has been seen."""
        if self._peak is None:
            return self.ceiling_s
        return min(self.ceiling_s, max(FLOOR_S, GAP_FACTOR * self.peak(now)))


@dataclass(slots=True)
class Sweep:
    """What one look at the watch found."""

    silent_streams: list[tuple[int, Attempt, float]]
    """(replica index, attempt, seconds silent) of streams past their replica's limit, not
    counting silence from before the replica's last verdict of working."""
    silent_replicas: list[tuple[int, float]]
    """(replica index, seconds silent) of replicas holding work that nothing came from."""


class SilenceWatch:
    """The attempts in flight per replica, their gaps and idle limits, and the last word."""

    def __init__(self, replicas: int, ceiling_s: float) -> None:
        self.ceiling_s = ceiling_s
        """0 turns the watch off: nothing is ever found silent."""
        self.limits = [IdleLimit(ceiling_s) for _ in range(replicas)]
        self.heard = [float("-inf")] * replicas
        """Per replica: when a chunk, an answer or a good probe last came from it."""
        self.verified = [float("-inf")] * replicas
        """Per replica: when a probe last found it working."""
        self.modelled_step_s = [0.0] * replicas
        """Per replica: the performance model's full-budget step on its card (0: unknown)."""
        self.attempts: list[set[Attempt]] = [set() for _ in range(replicas)]

    @property
    def enabled(self) -> bool:
        return self.ceiling_s > 0

    def limit_s(self, index: int, now: float) -> float:
        return self.limits[index].limit_s(now)

    # ---- what the proxy reports -----------------------------------------------------------

    def begin(self, index: int, attempt: Attempt) -> None:
        self.attempts[index].add(attempt)

    def end(self, index: int, attempt: Attempt) -> None:
        self.attempts[index].discard(attempt)

    def chunk(self, index: int, now: float, gap_s: float | None) -> None:
        """A chunk came from the replica; ``gap_s``: how long its stream waited for it (None
        for a stream's first chunk, whose wait is the time to first token)."""
        self.heard[index] = now
        if gap_s is not None:
            self.limits[index].observe(gap_s, now)

    def heard_from(self, index: int, now: float) -> None:
        """A whole answer, or a probe that generated: the replica works."""
        self.heard[index] = now

    def working(self, index: int, now: float) -> None:
        """A probe's verdict: the replica works, however long its streams were silent."""
        self.heard[index] = self.verified[index] = now

    def verdict_window_s(self, index: int, now: float, floor_s: float, calibration: float) -> float:
        """How long a probe of the replica may take before it is found stuck: two of its
        longest plausible steps (the module's docstring says why), at least ``floor_s``.
        ``calibration``: the fleet's measured over modelled speed (1 when unknown)."""
        modelled = self.modelled_step_s[index] / calibration if calibration > 0 else 0.0
        step = max(self.limits[index].peak(now), modelled)
        return max(floor_s, VERDICT_STEPS * step)

    # ---- what health checking asks --------------------------------------------------------

    def sweep(self, now: float) -> Sweep:
        found = Sweep([], [])
        if not self.enabled:
            return found
        for i, attempts in enumerate(self.attempts):
            if not attempts:
                continue
            limit = self.limits[i].limit_s(now)
            since = max(self.heard[i], min(a.started_at for a in attempts))
            if now - since > limit:
                found.silent_replicas.append((i, now - since))
            cleared = self.verified[i]
            for a in attempts:
                if a.streaming and now - max(a.waiting_since, cleared) > limit:
                    found.silent_streams.append((i, a, now - a.waiting_since))
        return found

    def interrupt_all(self, index: int, reason: str) -> int:
        """Stop every attempt waiting on the replica (a probe found it stuck); how many."""
        attempts = list(self.attempts[index])
        for a in attempts:
            a.interrupt(reason)
        return len(attempts)
