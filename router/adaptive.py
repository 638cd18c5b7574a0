"""Adaptive weights and batch sizes: pure rules, applied by the core on a timer.

Batch sizes, additive increase and multiplicative decrease (as TCP's congestion window). A
replica is *overloaded* in an interval when its engine says so: requests waiting in the
engine's own queue while its KV cache is full (``KV_FULL``; a queue beside free cache is a
burst being admitted a few prefills per step, not a batch too large), sequences preempted,
or a time to first token (from the moment the router sent the request) over
``ttft_target_s``. Overloaded for ``hysteresis`` intervals in a row, its batch size is cut by
``decrease``, never below what the engine showed it runs at once (fewer would idle part of
its batch; cutting straight to that count cost throughput near saturation, when a few long
requests briefly fill the cache); using all its slots without any overload and with nothing
waiting in the engine's own queue for as many intervals, it grows where its KV cache would
hold the added sequences without filling (``KV_FULL``), by an eighth, up to the fleet file's
size (past it only with ``grow_past_batch_size``, by a one-slot probe, ``PROBE``, until the
engine has taken a growth up). Never past the engine's own limit on sequences once a growth
has shown it (given more slots, the engine kept requests in its own queue while running no
more than before, for as many readings of its metrics, each checked as it arrives:
``undo_growth``): a batch size above it only queues requests inside the engine, where no
other replica can take them. With no signal at all (no
engine metrics, nothing sent) it stays where it is. Not from NVML utilization: a continuously
batching engine reads near 100% busy with one sequence or two hundred, so that signal shrank
every card towards 1 (docs/decisions/0003).

Weights (what the fixed splits, weighted round-robin and weighted random, use): each moves a
damped step toward its share of the fleet's learned capacity (router/capacity.py), scaled so
that the weights keep their static sum, and lowered where the replica's time to first token
is over the target. A card too little used to measure keeps its learned prior. Bounds are
multiples of the static weight, inside the range an operator may set (router/operator_values.py:
a tuner never writes a weight an operator would be refused); a pinned weight is left alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from router.config.schema import AdaptiveConfig
from router.operator_values import MAX_WEIGHT, MIN_WEIGHT


@dataclass(frozen=True, slots=True)
class TunerChange:
    """One setting a tuner moved: the replica, the setting, old and new value, and why."""

    replica: str
    setting: str
    """``weight`` or ``batch_size``."""
    old: float
    new: float
    signal: str
    """The reading that moved it, in words (``engine queue 12 for 2 rounds``...)."""

    @property
    def message(self) -> str:
        return f"{self.replica}: {self.setting} {self.old:.3g} -> {self.new:.3g} ({self.signal})"


@dataclass(frozen=True, slots=True)
class WeightInput:
    static: float
    current: float
    pinned: bool
    capacity: float
    """Learned capacity (cost units per second)."""
    ttft_s: float | None = None
    """90th-percentile time to first token from sending, over the last interval."""


def retune_weights(inputs: Sequence[WeightInput], cfg: AdaptiveConfig) -> list[float]:
    """The next effective weight of each replica, in input order."""
    free = [i for i in inputs if not i.pinned and i.capacity > 0]
    targets = {id(i): i.capacity * _ttft_penalty(i.ttft_s, cfg) for i in free}
    total = sum(targets.values())
    scale = sum(i.static for i in free) / total if total > 0 else 0.0
    lo, hi = cfg.weight_bounds
    out = []
    for i in inputs:
        if i.pinned or id(i) not in targets:
            out.append(i.current)
            continue
        step = i.current + cfg.weight_damping * (targets[id(i)] * scale - i.current)
        low, high = max(lo * i.static, MIN_WEIGHT), min(hi * i.static, MAX_WEIGHT)
        out.append(min(max(step, low), high))
    return out


def _ttft_penalty(ttft_s: float | None, cfg: AdaptiveConfig) -> float:
    # A replica answering slower than the target is sent proportionally less.
    if ttft_s is None or ttft_s <= cfg.ttft_target_s:
        return 1.0
    return cfg.ttft_target_s / ttft_s


KV_FULL = 0.9
"""KV-cache usage from which an engine's own queue means its batch is full."""

PROBE = 1
"""Slots a growth past the fleet file's size adds (``grow_past_batch_size``) until the engine
has run more than the size before a growth. vLLM publishes no
``max_num_seqs``, so a growth past it is found out only by requests queueing inside the
engine for two readings of its metrics; one slot tells whether the engine runs more as well
as an eighth does, and costs one queued request where 32 (an eighth at 256) cost more first
tokens over 2 s than the static size's whole run. Once the engine has taken a growth up, the
tuner grows by eighths."""


@dataclass(frozen=True, slots=True)
class BatchSignals:
    """What one interval showed of a replica's load. None: no fresh reading."""

    engine_waiting: int | None = None
    """Requests waiting in the engine's own queue (a fresh /metrics reading)."""
    engine_running: int | None = None
    """Requests the engine ran at once, by the same reading."""
    engine_kv_usage: float | None = None
    """The engine's KV-cache usage, 0..1, by the same reading (None: it does not say)."""
    preempted: int = 0
    """Sequences the engine preempted during the interval."""
    ttft_s: float | None = None
    """90th-percentile time to first token from sending, over the interval."""
    saturated: bool = False
    """The replica had all its slots in use at some point of the interval."""

    def overload(self, cfg: AdaptiveConfig) -> str | None:
        """The overload signal in words, or None when there is none."""
        if self.engine_waiting and self.kv_full:
            return f"engine queue {self.engine_waiting}"
        if self.preempted > 0:
            return f"{self.preempted} preempted"
        if self.ttft_s is not None and self.ttft_s > cfg.ttft_target_s:
            return f"TTFT p90 {self.ttft_s:.2f} s over {cfg.ttft_target_s:g} s"
        return None

    @property
    def kv_full(self) -> bool:
        """The KV cache is full, or the engine does not say (TGI): then its queue counts."""
        return self.engine_kv_usage is None or self.engine_kv_usage >= KV_FULL

    def kv_room_for(self, factor: float) -> bool:
        """Whether the KV cache would hold ``factor`` times the sequences it holds now
        without filling (True when the engine does not say): more slots than that would only
        queue requests inside the engine, or preempt."""
        usage = self.engine_kv_usage
        return usage is None or usage * factor < KV_FULL

    @property
    def any(self) -> bool:
        return self.engine_waiting is not None or self.ttft_s is not None or self.preempted > 0


@dataclass(slots=True)
class BatchStreak:
    """Consecutive intervals a replica has spent overloaded (high) or saturated and not (low),
    and what its engine showed of its own limit on sequences."""

    low: int = 0
    high: int = 0
    grown_from: int | None = None
    """The batch size before the tuner last grew it."""
    capped: int = 0
    """Consecutive intervals since that growth that the engine kept requests in its own queue
    while running the same number (``capped_at``), short of what the growth allowed."""
    capped_at: int | None = None
    ceiling: int | None = None
    """The most the engine runs at once (its ``max_num_seqs``), once it has shown it."""
    taken_up: bool = False
    """The engine ran more than the size before the last growth: it was not at its own
    limit, so the next growth may be a full eighth rather than a probe."""


def retune_batch(
    current: int,
    signals: BatchSignals,
    streak: BatchStreak,
    cfg: AdaptiveConfig,
    configured: int,
) -> tuple[int, str]:
    """The next batch size and the signal that moved it ("" when it did not move).
    ``configured``: the replica's batch size in the fleet file, the most it grows to unless
    ``cfg.grow_past_batch_size``."""
    need = max(2, cfg.hysteresis)
    lo, hi = cfg.batch_bounds
    overload = signals.overload(cfg)
    if overload is not None:
        streak.low, streak.high = 0, streak.high + 1
        if streak.high < need:
            return current, ""
        streak.high = 0
        # Never below what the engine showed it runs at once: fewer would idle its batch.
        target = max(math.floor(current * cfg.decrease), signals.engine_running or lo)
        cut = max(lo, min(current - 1, target))
        return (cut, f"{overload} for {need} intervals") if cut < current else (current, "")
    streak.high = 0
    ceiling = streak.ceiling
    # More slots are worth having only while the engine runs all it is given: with requests
    # waiting in its own queue (its max_num_seqs reached), more would wait there too.
    if not (signals.any and signals.saturated) or signals.engine_waiting:
        streak.low = 0
        return current, ""
    streak.low += 1
    if not cfg.grow_past_batch_size:
        hi = min(hi, max(configured, lo))
    top = hi if ceiling is None else min(hi, max(ceiling, lo))
    grown = min(top, _grown(current, configured, streak))
    if streak.low < need or current >= top or not signals.kv_room_for(grown / current):
        return current, ""
    streak.low = 0
    streak.grown_from = current
    return grown, f"all {current} slots in use, no overload for {need} intervals"


def _grown(current: int, configured: int, streak: BatchStreak) -> int:
    """The size one growth reaches: an eighth up to the fleet file's size or once the engine
    has taken a growth up; past them a probe (the engine may be at its own limit, and slots
    it does not take only queue requests inside it until the limit is learned)."""
    eighth = current + max(1, current // 8)
    if streak.taken_up:
        return eighth
    if current < configured:
        return min(eighth, configured)
    return current + PROBE


def undo_growth(
    current: int, signals: BatchSignals, streak: BatchStreak, cfg: AdaptiveConfig
) -> tuple[int, str]:
    """On each fresh reading of the engine's own metrics (not once a round: slots the engine
    does not take up queue requests inside it until this returns them), the batch size back
    at the engine's limit once ``hysteresis`` readings in a row show it, and why ("" when it
    does not move)."""
    need = max(2, cfg.hysteresis)
    lo = cfg.batch_bounds[0]
    ceiling = _note_ceiling(signals, streak, current, need)
    if ceiling is None or not lo <= ceiling < current:
        return current, ""
    streak.low = streak.high = 0
    why = f"the engine ran at most {ceiling} at once for {need} readings, more queued in it"
    return ceiling, why


def _note_ceiling(
    signals: BatchSignals, streak: BatchStreak, current: int, need: int
) -> int | None:
    """Learn the engine's own limit on sequences run at once, from a growth that it did not
    take up: given more slots, it kept requests in its own queue while running the same
    number, at least the old size but fewer than the new, ``need`` readings in a row (a
    burst being admitted a few prefills per step shows a running count that rises). More
    slots then only queue requests inside the engine, where no other replica can take them
    (the tuner grew into that queue and was cut back by its TTFT, over and over). Returns
    the limit when this reading completes the evidence for it."""
    running = signals.engine_running
    if running is not None and streak.ceiling is not None and running > streak.ceiling:
        streak.ceiling = None  # it runs more now: restarted with a larger limit
        streak.taken_up = True
    base = streak.grown_from
    if base is not None and running is not None and running > base:
        streak.taken_up = True
    if base is None or not signals.engine_waiting or running is None:
        streak.capped = 0
        return None
    if not base <= running < current:
        streak.capped = 0
        return None
    streak.capped = streak.capped + 1 if running == streak.capped_at else 1
    streak.capped_at = running
    if streak.capped < need:
        return None
    streak.ceiling, streak.grown_from, streak.capped = running, None, 0
    streak.taken_up = False
    return running
