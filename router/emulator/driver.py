"""Runs one replica's engine (router.sim.engine) in real time, and follows its requests.

A task loops ``d = engine.start_step(); sleep(d / time_scale); engine.finish_step()`` while the
engine has work, then waits for work. Each finished step wakes the requests it moved: a waiting
request's own event fires when its first token comes out (or it finishes), and one shared
event per step wakes every stream that is decoding. A decoding sequence advances one token per
step, so a stream reads its progress from the engine's per-sequence base counters in O(1)
instead of the driver touching every running sequence each step.

Times the replica reports (time to first token, end-to-end latency) are in engine time: the
sum of the model's step durations while busy, wall time times ``time_scale`` while idle. They
are what a real GPU would show, whatever the time scale and however busy the host is.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Protocol

from router.sim.engine import Engine, Sequence, StepCost, StepOutcome

__all__ = ["EngineDriver", "EngineObserver", "Generation"]

_MAX_LAG_S = 0.05
"""Wall seconds the driver may fall behind before it stops catching up (no bursts after)."""


class EngineObserver(Protocol):
    """Told what the engine did, in engine seconds (the replica's metrics)."""

    def on_first_token(self, ttft_s: float, prompt_tokens: int) -> None: ...

    def on_finished(self, e2e_s: float, output_tokens: int) -> None: ...

    def on_aborted(self, generated_tokens: int) -> None: ...

    def on_step(self, duration_s: float, decode_tokens: int, prefill_tokens: int) -> None: ...


@dataclass(eq=False, slots=True)
class Generation:
    """One request inside the engine, as its HTTP handler follows it."""

    seq: Sequence
    arrived_at: float
    """Engine time the request arrived."""
    scheduled_at: float | None = None
    """Engine time its prefill first began (the end of its wait in the queue)."""
    first_token_at: float | None = None
    finished_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the first token comes out and when the request finishes."""

    @property
    def done(self) -> bool:
        return self.finished_at is not None


class _Slowed:
    """A step cost multiplied by a factor: the ``slow`` fault."""

    def __init__(self, base: StepCost, factor: float) -> None:
        self.base = base
        self.factor = factor

    def __call__(self, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
        return self.base(prefill_tokens, decode_seqs, decode_context_tokens) * self.factor


class EngineDriver:
    """The real-time loop around one engine."""

    def __init__(
        self, engine: Engine, *, time_scale: float = 1.0, observer: EngineObserver | None = None
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self._observer = observer
        self._base_cost = engine.cost
        self._live: dict[str, Generation] = {}
        self._ids = itertools.count()
        self._work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # The engine clock reads _clock_v at wall time _clock_wall; from there it follows the
        # wall (scaled) while idle, the running step while busy, and stands still in between.
        self._clock_v = 0.0
        self._clock_wall = 0.0
        self._step_s: float | None = None
        self._wall_target = 0.0
        self._thawed = asyncio.Event()
        """Clear while frozen: the loop starts no step until it is set again."""
        self._thawed.set()
        self._frozen_at = 0.0

    def observe(self, observer: EngineObserver | None) -> None:
        """Report to ``observer`` from now on (a restarted engine has fresh metrics)."""
        self._observer = observer

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._clock_wall = asyncio.get_running_loop().time()
            self._task = asyncio.create_task(self._run(), name="emulated-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- requests -------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, output_tokens: int) -> Generation:
        """Queue a request; ValueError if it could never fit the KV cache."""
        seq = Sequence(f"seq-{next(self._ids)}", prompt_tokens, output_tokens)
        now = self.now()
        self.engine.add(seq)
        if self._idle.is_set():
            # The engine starts at the arrival, not when the loop gets round to it.
            self._clock_v, self._clock_wall = now, asyncio.get_running_loop().time()
            self._idle.clear()
        gen = Generation(seq, now)
        self._live[seq.id] = gen
        self._work.set()
        return gen

    def release(self, gen: Generation) -> None:
        """The request's handler is done with it; cancels it in the engine if unfinished."""
        if self._live.pop(gen.seq.id, None) is None or gen.done:
            return
        produced = self.produced(gen)  # before the engine forgets where the sequence was
        self.engine.cancel(gen.seq.id)
        if self._observer is not None:
            self._observer.on_aborted(produced)
        self._work.set()

    def produced(self, gen: Generation) -> int:
        """Tokens the request has generated so far."""
        seq = gen.seq
        if self.engine.decoding.get(seq.id) is seq:
            return seq.decode_base_generated + (self.engine.step_no - seq.decode_base_step)
        return seq.generated

    async def wait_progress(self, gen: Generation, seen: int) -> int:
        """Wait until the request has more than ``seen`` tokens, or is done; its count."""
        while True:
            n = self.produced(gen)
            if n > seen or gen.done:
                return n
            if n == 0:
                gen.changed.clear()
                await gen.changed.wait()
            else:
                await self._tick.wait()

    async def wait_done(self, gen: Generation) -> None:
        while not gen.done:
            gen.changed.clear()
            await gen.changed.wait()

    async def wait_idle(self) -> None:
        """Until the engine has nothing left to run."""
        await self._idle.wait()

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished or released."""
        return len(self._live)

    # --- faults and time ------------------------------------------------------------------

    def set_slowdown(self, factor: float) -> None:
        """Multiply every step's duration by ``factor`` (1 restores the model's own)."""
        if factor <= 0:
            raise ValueError(f"slowdown factor must be > 0, got {factor}")
        self.engine.cost = self._base_cost if factor == 1 else _Slowed(self._base_cost, factor)

    @property
    def frozen(self) -> bool:
        return not self._thawed.is_set()

    def freeze(self) -> None:
        """Start no more steps (the ``freeze`` fault): requests are still queued, none
        advances. A step already running finishes, as a GPU finishes the kernel it began."""
        if self._thawed.is_set():
            self._frozen_at = asyncio.get_running_loop().time()
            self._thawed.clear()

    def thaw(self) -> None:
        """Run steps again, from where the engine stood."""
        if self._thawed.is_set():
            return
        wall = asyncio.get_running_loop().time()
        if not self._idle.is_set():
            # A busy engine's clock stood still while frozen; the requests it held waited in
            # engine time too (a real engine's TTFT counts the freeze).
            self._clock_v += (wall - max(self._frozen_at, self._clock_wall)) * self.time_scale
            self._clock_wall = wall
        self._thawed.set()

    def busy_reading(self) -> tuple[float, float]:
        """The loop's clock now, and the engine seconds spent in steps up to then.

        A step's duration is known (and added to the engine's ``busy_seconds``) when it
        starts; the part of the running step still to come is taken off, so that a reading
        taken inside one long step (a full prefill chunk on a V100 lasts over a second)
        counts the time that step has run rather than nothing.
        """
        wall = asyncio.get_running_loop().time()
        busy = self.engine.busy_seconds
        if self._step_s is not None:
            elapsed = (wall - self._clock_wall) * self.time_scale
            busy -= self._step_s - min(max(0.0, elapsed), self._step_s)
        return wall, busy

    def now(self) -> float:
        """Engine time, seconds since the driver started."""
        elapsed = (asyncio.get_running_loop().time() - self._clock_wall) * self.time_scale
        if self._idle.is_set():
            return self._clock_v + elapsed
        if self._step_s is not None:
            return self._clock_v + min(elapsed, self._step_s)
        return self._clock_v

    # --- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._thawed.is_set():
                await self._thawed.wait()
                self._wall_target = loop.time()
            duration = 0.0 if self.engine.idle else self.engine.start_step()
            if duration <= 0.0:
                # Idle, or the queue's head cannot be admitted until something is cancelled.
                self._go_idle(loop.time())
                await self._work.wait()
                self._wall_target = loop.time()
                continue
            self._began(duration)
            now = loop.time()
            self._clock_wall, self._step_s = now, duration
            self._wall_target = (
                max(self._wall_target, now - _MAX_LAG_S) + duration / self.time_scale
            )
            await asyncio.sleep(max(0.0, self._wall_target - now))
            out = self.engine.finish_step()
            self._clock_v += duration
            self._clock_wall, self._step_s = loop.time(), None
            self._dispatch(out)

    def _began(self, duration: float) -> None:
        """A step starts at engine time ``_clock_v``: stamp the requests it schedules first."""
        # Admitted and not yet through their prefill: at most a step's token budget of them.
        for seq in self.engine.prefilling:
            gen = self._live.get(seq.id)
            if gen is not None and gen.scheduled_at is None:
                gen.scheduled_at = self._clock_v
        if self._observer is not None:
            decode = len(self.engine.decoding)
            self._observer.on_step(duration, decode, self.engine.step_prefill_tokens)

    def _go_idle(self, wall: float) -> None:
        self._work.clear()
        if self.engine.idle and not self._idle.is_set():
            self._clock_wall = wall
            self._idle.set()

    def _dispatch(self, out: StepOutcome) -> None:
        now = self._clock_v
        for seq in out.first_tokens:
            gen = self._live.get(seq.id)
            if gen is not None:
                gen.first_token_at = now
                gen.changed.set()
                if self._observer is not None:
                    self._observer.on_first_token(now - gen.arrived_at, seq.prompt_tokens)
        for seq in out.finished:
            gen = self._live.pop(seq.id, None)
            if gen is not None:
                gen.finished_at = now
                gen.changed.set()
                if self._observer is not None:
                    self._observer.on_finished(now - gen.arrived_at, seq.output_tokens)
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()
