"""One round of the adaptive tuners over a pool: gathers each replica's signals since the last
round and applies the pure rules of router/adaptive.py.

The core feeds it as requests start (the most requests in flight at once) and produce their
first byte (time to first token from sending); engine readings (queue, preemption counter)
are read off ``Replica.engine`` when fresh. Between rounds, each new engine reading is checked
for a growth the engine did not take up (``readings``), so it is undone within seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.adaptive import (
    BatchSignals,
    BatchStreak,
    TunerChange,
    WeightInput,
    retune_batch,
    retune_weights,
    undo_growth,
)
from router.config.schema import AdaptiveConfig
from router.replica import Replica
from router.stats import percentile


class Tuner:
    def __init__(self, replicas: Sequence[Replica], cfg: AdaptiveConfig, stale_after_s: float):
        self.cfg = cfg
        self.stale_after_s = stale_after_s
        # Off, the request path records nothing for rounds that never run.
        self.enabled = cfg.weights or cfg.batch_sizes
        n = len(replicas)
        self._streaks = [BatchStreak() for _ in range(n)]
        self._peak = [0] * n
        self._ttfts: list[list[float]] = [[] for _ in range(n)]
        self._preemptions: list[int | None] = [None] * n
        self._read_at: list[float | None] = [None] * n
        """When each replica's last engine reading checked by ``readings`` was taken."""

    # ---- signals, from the core ------------------------------------------------------------

    def started(self, r: Replica) -> None:
        if self.enabled and r.in_flight > self._peak[r.index]:
            self._peak[r.index] = r.in_flight

    def first_byte(self, r: Replica, seconds: float) -> None:
        if not self.enabled:
            return
        samples = self._ttfts[r.index]
        if len(samples) < 4096:  # a round's worth; bounded whatever the rate
            samples.append(seconds)

    # ---- one round -------------------------------------------------------------------------

    def round(self, replicas: Sequence[Replica], now: float) -> list[TunerChange]:
        """Retune what is configured; the changes, applied to the replicas."""
        signals = [self._signals(r, now) for r in replicas]
        changes: list[TunerChange] = []
        if self.cfg.weights:
            changes += self._weights(replicas, signals)
        if self.cfg.batch_sizes:
            changes += self._batches(replicas, signals)
        for r in replicas:
            self._peak[r.index] = r.in_flight
            self._ttfts[r.index] = []
        return changes

    def readings(self, replicas: Sequence[Replica], now: float) -> list[TunerChange]:
        """After a poll of the engines' metrics: undo a growth that each new reading (one not
        seen before, and fresh) shows the engine did not take up; the changes, applied."""
        if not self.cfg.batch_sizes:
            return []
        changes = []
        for r in replicas:
            e = r.engine
            if r.batch_pinned or e is None or e.received_at == self._read_at[r.index]:
                continue
            self._read_at[r.index] = e.received_at
            if now - e.received_at > self.stale_after_s:
                continue
            signals = BatchSignals(
                engine_waiting=e.waiting, engine_running=e.running, engine_kv_usage=e.kv_usage
            )
            size, why = undo_growth(r.batch_size, signals, self._streaks[r.index], self.cfg)
            if size != r.batch_size:
                changes.append(TunerChange(r.id, "batch_size", r.batch_size, size, why))
                r.batch_size = size
        return changes

    def _signals(self, r: Replica, now: float) -> BatchSignals:
        i, e = r.index, r.engine
        fresh = e is not None and now - e.received_at <= self.stale_after_s
        preempted = 0
        if fresh and e is not None and e.preemptions_total is not None:
            last = self._preemptions[i]
            # A counter that went down is an engine restart: a new baseline, not a negative.
            if last is not None and e.preemptions_total >= last:
                preempted = e.preemptions_total - last
            self._preemptions[i] = e.preemptions_total
        return BatchSignals(
            engine_waiting=e.waiting if fresh and e is not None else None,
            engine_running=e.running if fresh and e is not None else None,
            engine_kv_usage=e.kv_usage if fresh and e is not None else None,
            preempted=preempted,
            ttft_s=percentile(self._ttfts[i], 0.9),
            saturated=self._peak[i] >= r.batch_size,
        )

    def _weights(
        self, replicas: Sequence[Replica], signals: Sequence[BatchSignals]
    ) -> list[TunerChange]:
        inputs = [
            WeightInput(r.config.weight, r.weight, r.weight_pinned, r.speed, s.ttft_s)
            for r, s in zip(replicas, signals, strict=True)
        ]
        changes = []
        for r, weight in zip(replicas, retune_weights(inputs, self.cfg), strict=True):
            if abs(weight - r.weight) > 1e-3 * r.weight:
                signal = f"learned capacity {r.speed:.0f} cost/s"
                changes.append(TunerChange(r.id, "weight", r.weight, weight, signal))
                r.weight = weight
        return changes

    def _batches(
        self, replicas: Sequence[Replica], signals: Sequence[BatchSignals]
    ) -> list[TunerChange]:
        changes = []
        for r, s in zip(replicas, signals, strict=True):
            if r.batch_pinned:
                continue
            streak = self._streaks[r.index]
            size, why = retune_batch(r.batch_size, s, streak, self.cfg, r.config.batch_size)
            if size != r.batch_size:
                changes.append(TunerChange(r.id, "batch_size", r.batch_size, size, why))
                r.batch_size = size
        return changes
