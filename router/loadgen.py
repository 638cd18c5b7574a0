"""An open-loop load generator: real HTTP requests to a router's front door, on a schedule.

Two halves. ``schedule`` turns rate phases (requests per second, burstiness, a length mix,
a priority mix) into timed :class:`Shot` s, deterministically from a seed; the simulator can
run the very same shots. :class:`LoadGenerator` sends them with aiohttp to
``/v1/completions`` at their times, without waiting for answers (open loop: a slow fleet
does not slow the offered load), and counts every shot by how it ended. It is bounded three
ways: a count, a duration, and a cap on requests in flight (a shot due while the cap is
reached is counted ``not_sent``, never queued). It also notes how late each request went
out (``LoadReport.late_s``): a busy machine delays the generator before anything else, so
that is the first sign a run measured the machine rather than the fleet.

Lengths go over the wire as the emulator and the router read them: the prompt is text of
four characters per token; ``max_tokens`` is what the client allows (the phase's cap, or by
default the request's own output length, as ``vllm bench serve`` sends it); the output length
the "model" writes before it stops goes in the emulator's ``gpurouter.output_tokens`` hint,
which the router passes through unread and vLLM ignores.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import aiohttp
import orjson

from router.request import Priority
from router.sim.workload import LengthMix, gamma

__all__ = [
    "OUTCOMES",
    "LoadGenerator",
    "LoadReport",
    "RatePhase",
    "Shot",
    "ShotResult",
    "prompt_text",
    "schedule",
]

OUTCOMES = ("completed", "rejected", "expired", "failed", "error", "cut_off", "not_sent")
"""How a shot ended: completed (2xx), rejected (429), expired (504), failed (any other HTTP
error, or an error event in the stream), error (no HTTP answer: connection or timeout),
cut_off (still running when the generator stopped), not_sent (the in-flight cap was reached)."""


@dataclass(frozen=True, slots=True)
class Shot:
    """One request to send."""

    at_s: float
    """When to send it, in seconds from the start of the schedule."""
    prompt_tokens: int
    max_tokens: int
    """What the client sends as ``max_tokens``."""
    priority: Priority = Priority.NORMAL
    output_tokens: int | None = None
    """How long the answer is (at most ``max_tokens``), sent as the emulator's
    ``gpurouter.output_tokens`` hint; None sends no hint (the engine writes up to
    ``max_tokens``)."""


@dataclass(frozen=True, slots=True)
class RatePhase:
    """A stretch of steady offered load."""

    duration_s: float
    rate_rps: float
    mix: LengthMix
    burstiness: float = 1.0
    """Gamma shape of inter-arrival times: 1 is Poisson, smaller is burstier."""
    priorities: Mapping[Priority, float] = field(default_factory=lambda: {Priority.NORMAL: 1.0})
    """Share of each priority (they need not add up to 1)."""
    max_tokens: int | None = None
    """What every client sends as ``max_tokens``; None: each request's own output length."""


def schedule(phases: Sequence[RatePhase], seed: int = 0) -> Iterator[Shot]:
    """The shots of ``phases`` one after another, in time order; the same seed, the same shots."""
    arrivals = random.Random(seed)
    # Priorities have their own stream, so that changing the mix leaves the arrivals alone.
    draws = random.Random(seed + 7919)
    start = 0.0
    for phase in phases:
        kinds = list(phase.priorities)
        weights = [phase.priorities[k] for k in kinds]
        shots = gamma(
            phase.rate_rps,
            phase.burstiness,
            phase.duration_s,
            phase.mix,
            arrivals,
            phase.max_tokens,
        )
        for a in shots:
            priority = kinds[0] if len(kinds) == 1 else draws.choices(kinds, weights)[0]
            yield Shot(start + a.time, a.prompt_tokens, a.max_tokens, priority, a.output_tokens)
        start += phase.duration_s


def prompt_text(tokens: int) -> str:
    """Text that the router and the emulator count as ``tokens`` prompt tokens (4 chars each)."""
    return "tok " * max(1, tokens)


@dataclass(frozen=True, slots=True)
class ShotResult:
    shot: Shot
    outcome: str
    """One of OUTCOMES."""
    sent_at: float
    """Seconds from the start (the generator's clock) when it was sent."""
    first_byte_s: float | None = None
    """Time from sending to the first byte of the answer."""
    latency_s: float | None = None
    """Time from sending to the end of the answer."""
    status: int | None = None
    error: str | None = None
    """For an ``error``: the exception's type and message, to tell a refused connection
    from a reset or a timeout."""


@dataclass(slots=True)
class LoadReport:
    results: list[ShotResult] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    late_s: list[float] = field(default_factory=list)
    """For every shot sent, the wall seconds it went out behind its time (0 when on time).
    An open-loop generator that sends late offers less load than planned and shifts every
    arrival: a run whose shots went out late measured the machine, not the fleet."""

    @property
    def sent(self) -> int:
        return sum(n for outcome, n in self.counts.items() if outcome != "not_sent")


class LoadGenerator:
    """Sends shots to ``base_url`` (the front door) at their times."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_in_flight: int = 512,
        timeout_s: float = 120.0,
        stream: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.max_in_flight = max_in_flight
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.stream = stream
        self.clock = clock
        self.in_flight = 0

    async def run(
        self,
        shots: Iterable[Shot],
        *,
        max_requests: int,
        max_duration_s: float,
        drain_s: float = 30.0,
        time_scale: float = 1.0,
        on_result: Callable[[ShotResult], None] | None = None,
        on_drained: Callable[[], Awaitable[None] | None] | None = None,
        start_at: float | None = None,
    ) -> LoadReport:
        """Send shots (their times divided by ``time_scale``) until ``max_requests`` are sent
        or ``max_duration_s`` of wall time has passed; then wait up to ``drain_s`` for the
        answers still coming, call (and await, if it is a coroutine) ``on_drained``, and cut
        off the rest. ``start_at``: the clock reading that is time 0 of the schedule (default:
        now), so that another process can start its own clock at the same instant."""
        report = LoadReport()

        def done(result: ShotResult) -> None:
            report.results.append(result)
            report.counts[result.outcome] += 1
            if on_result is not None:
                on_result(result)

        tasks: set[asyncio.Task[None]] = set()
        start = self.clock() if start_at is None else start_at
        if start_at is not None and start_at > self.clock():
            await asyncio.sleep(start_at - self.clock())
        limit = aiohttp.TCPConnector(limit=self.max_in_flight)
        async with aiohttp.ClientSession(connector=limit, timeout=self.timeout) as session:
            count = 0
            for shot in shots:
                due = shot.at_s / time_scale
                if count >= max_requests or due >= max_duration_s:
                    break
                wait = due - (self.clock() - start)
                if wait > 0:
                    await asyncio.sleep(wait)
                count += 1
                if self.in_flight >= self.max_in_flight:
                    done(ShotResult(shot, "not_sent", self.clock() - start))
                    continue
                task = asyncio.create_task(
                    self._send(session, shot, start + due, start, done, report.late_s)
                )
                tasks.add(task)
                # Counted now (the task may not start before the next shot) and settled when
                # it ends, even if it is cut off before it starts.
                self.in_flight += 1
                task.add_done_callback(partial(self._settled, tasks, shot, start, done))
            if tasks:
                await asyncio.wait(set(tasks), timeout=drain_s)
            if on_drained is not None:
                pending = on_drained()
                if pending is not None:
                    await pending
            for task in list(tasks):
                task.cancel()
            for task in list(tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return report

    def _settled(
        self,
        tasks: set[asyncio.Task[None]],
        shot: Shot,
        start: float,
        done: Callable[[ShotResult], None],
        task: asyncio.Task[None],
    ) -> None:
        tasks.discard(task)
        self.in_flight -= 1
        if task.cancelled():  # cut off, whether it had started or not
            done(ShotResult(shot, "cut_off", self.clock() - start))

    async def _send(
        self,
        session: aiohttp.ClientSession,
        shot: Shot,
        due: float,
        start: float,
        done: Callable[[ShotResult], None],
        late: list[float],
    ) -> None:
        body: dict[str, object] = {
            "model": self.model,
            "prompt": prompt_text(shot.prompt_tokens),
            "max_tokens": shot.max_tokens,
            "stream": self.stream,
        }
        if shot.output_tokens is not None:
            body["gpurouter"] = {"output_tokens": shot.output_tokens}
        headers = {"Content-Type": "application/json", "X-Priority": shot.priority.name.lower()}
        sent = self.clock()
        # Measured when the request goes out, not when it was scheduled: a task that waits
        # for a busy loop is as late as a generator that overslept.
        late.append(max(0.0, sent - due))
        first: float | None = None
        try:
            async with session.post(self.url, data=orjson.dumps(body), headers=headers) as resp:
                first = self.clock() - sent
                failed = await _read(resp)
                status = resp.status
            outcome = _outcome(status, failed)
            done(ShotResult(shot, outcome, sent - start, first, self.clock() - sent, status))
        except (aiohttp.ClientError, TimeoutError) as exc:
            done(ShotResult(shot, "error", sent - start, first, error=_describe(exc)))


async def _read(resp: aiohttp.ClientResponse) -> bool:
    """Read the whole answer; True when a stream carried an error event."""
    if not resp.content_type.startswith("text/event-stream"):
        await resp.read()
        return False
    failed = False
    async for line in resp.content:
        if line.startswith(b"data:") and b'"error"' in line:
            with contextlib.suppress(orjson.JSONDecodeError):
                failed = failed or "error" in orjson.loads(line[5:])
    return failed


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _outcome(status: int, stream_failed: bool) -> str:
    if status < 300:
        return "failed" if stream_failed else "completed"
    if status == 429:
        return "rejected"
    if status == 504:
        return "expired"
    return "failed"
