"""Workloads for the simulator: arrival processes and request length mixes.

Arrivals are Poisson or gamma-bursty (as ``vllm bench serve`` defines burstiness: gamma
inter-arrival times with shape ``burstiness`` and the same mean, so 1 is Poisson and smaller
is burstier), or a real trace replayed with its own timing, rescaled to a target rate. Lengths
come from lognormal fits or are drawn from a trace's rows.

Each arrival carries two output lengths: ``max_tokens``, what the client sends (the router's
only knowledge of how long the answer may be), and ``output_tokens``, what the engine will
generate (the trace's length, at most ``max_tokens``). By default a client sends its request's
own output length, as ``vllm bench serve`` does for its datasets; with a ``max_tokens`` cap
every client sends that cap and the engine still stops at the trace's length.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

from router.errors import ConfigError, Problem


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    """Seconds from the start of the run."""
    prompt_tokens: int
    output_tokens: int
    """Tokens the engine will generate before the "model" stops (at most ``max_tokens``)."""
    max_tokens: int
    """What the client sends as ``max_tokens``: all the router learns of the output."""


def arrival(
    time: float, prompt_tokens: int, output_tokens: int, max_tokens: int | None = None
) -> Arrival:
    """An arrival whose client sends ``max_tokens`` (None: its own output length); the engine
    generates ``output_tokens``, cut at that cap."""
    if max_tokens is None:
        return Arrival(time, prompt_tokens, output_tokens, output_tokens)
    return Arrival(time, prompt_tokens, min(output_tokens, max_tokens), max_tokens)


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float
    """Seconds from the trace's first request."""
    prompt_tokens: int
    output_tokens: int


class LengthMix:
    """Where (prompt, output) lengths come from."""

    mean_prompt: float
    mean_output: float

    def sample(self, rng: random.Random) -> tuple[int, int]:
        raise NotImplementedError


class LognormalMix(LengthMix):
    """Lognormal prompt and output lengths from their medians and means, capped."""

    def __init__(
        self, prompt: tuple[float, float], output: tuple[float, float], cap: int = 32768
    ) -> None:
        self._p = _lognormal(*prompt)
        self._o = _lognormal(*output)
        self.cap = cap
        self.mean_prompt, self.mean_output = prompt[1], output[1]

    @classmethod
    def fit(cls, rows: Sequence[TraceRow], cap: int = 32768) -> LognormalMix:
        """The lognormal with each length's median and mean in ``rows`` (a trace's fit)."""
        if not rows:
            raise ValueError("a lognormal fit needs at least one row")
        prompts = sorted(r.prompt_tokens for r in rows)
        outputs = sorted(r.output_tokens for r in rows)
        return cls(_median_mean(prompts), _median_mean(outputs), cap)

    def sample(self, rng: random.Random) -> tuple[int, int]:
        p = min(self.cap, max(1, round(rng.lognormvariate(*self._p))))
        o = min(self.cap, max(1, round(rng.lognormvariate(*self._o))))
        return p, o


class TraceMix(LengthMix):
    """Lengths drawn uniformly from a trace's rows (its exact empirical mix)."""

    def __init__(self, rows: Sequence[TraceRow]) -> None:
        if not rows:
            raise ValueError("a trace mix needs at least one row")
        self.rows = rows
        self.mean_prompt = sum(r.prompt_tokens for r in rows) / len(rows)
        self.mean_output = sum(r.output_tokens for r in rows) / len(rows)

    def sample(self, rng: random.Random) -> tuple[int, int]:
        row = self.rows[rng.randrange(len(self.rows))]
        return row.prompt_tokens, row.output_tokens


class CappedMix(LengthMix):
    """Another mix with every output cut at ``cap`` tokens: what engines generate when every
    client sends ``max_tokens = cap``."""

    def __init__(self, mix: LengthMix, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"a max_tokens cap must be >= 1, got {cap}")
        self.mix = mix
        self.cap = cap
        self.mean_prompt = mix.mean_prompt
        if isinstance(mix, TraceMix):
            outputs = [min(r.output_tokens, cap) for r in mix.rows]
            self.mean_output = sum(outputs) / len(outputs)
        else:
            # No closed form for every mix: the mean of a fixed sample (the same every time).
            rng = random.Random(0)
            draws = [min(mix.sample(rng)[1], cap) for _ in range(_MEAN_SAMPLE)]
            self.mean_output = sum(draws) / len(draws)

    def sample(self, rng: random.Random) -> tuple[int, int]:
        p, o = self.mix.sample(rng)
        return p, min(o, self.cap)


_MEAN_SAMPLE = 10_000


def _median_mean(ordered: Sequence[int]) -> tuple[float, float]:
    n = len(ordered)
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    # A lognormal needs median <= mean; a sample skewed the other way gets the closest one.
    mean = sum(ordered) / n
    return median, max(median, mean)


def _lognormal(median: float, mean: float) -> tuple[float, float]:
    if not 0 < median <= mean:
        raise ValueError(f"lognormal needs 0 < median <= mean, got {median} and {mean}")
    return math.log(median), math.sqrt(2.0 * math.log(mean / median))


def poisson(
    rate: float,
    duration: float,
    mix: LengthMix,
    rng: random.Random,
    max_tokens: int | None = None,
) -> Iterator[Arrival]:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds."""
    return gamma(rate, 1.0, duration, mix, rng, max_tokens)


def gamma(
    rate: float,
    burstiness: float,
    duration: float,
    mix: LengthMix,
    rng: random.Random,
    max_tokens: int | None = None,
) -> Iterator[Arrival]:
    """Gamma inter-arrivals with mean 1/rate and shape ``burstiness`` (1.0 is Poisson); every
    client sends ``max_tokens`` (None: its request's own output length)."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    t = 0.0
    scale = 1.0 / (rate * burstiness)
    while True:
        t += rng.gammavariate(burstiness, scale)
        if t >= duration:
            return
        p, o = mix.sample(rng)
        yield arrival(t, p, o, max_tokens)


def replay(
    rows: Sequence[TraceRow], rate: float, duration: float, max_tokens: int | None = None
) -> Iterator[Arrival]:
    """A trace with its own burstiness, time-scaled to a mean of ``rate`` per second.

    The trace loops if the run outlasts it. Every client sends ``max_tokens`` (None: its
    request's own output length).
    """
    if not rows:
        return
    span = rows[-1].offset_s or 1.0
    scale = (len(rows) / span) / rate
    lap = 0.0
    while True:
        for r in rows:
            t = lap + r.offset_s * scale
            if t >= duration:
                return
            yield arrival(t, r.prompt_tokens, r.output_tokens, max_tokens)
        lap += span * scale + scale * span / len(rows)


def load_trace(path: str | Path) -> list[TraceRow]:
    """Read a CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            return _rows(csv.DictReader(f), str(p))
    except OSError as exc:
        raise ConfigError(
            [Problem(str(p), None, "trace", f"cannot read: {exc.strerror}")]
        ) from None


def bundled_trace(name: str) -> list[TraceRow]:
    """One of the Azure LLM inference traces shipped with gpurouter: ``code`` or ``conv``.

    Source: Azure Public Dataset (CC-BY 4.0); Patel et al., "Splitwise: Efficient generative
    LLM inference using phase splitting", ISCA 2024. The license and attribution ship beside
    the files.
    """
    ref = resources.files("router.sim") / "traces" / "azure-llm-2023" / f"{name}.csv"
    with resources.as_file(ref) as path:
        return load_trace(path)


def _rows(reader: csv.DictReader[str], source: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    start: datetime | None = None
    for line, rec in enumerate(reader, start=2):
        try:
            stamp = datetime.fromisoformat(rec["TIMESTAMP"].strip()[:26])
            prompt, output = int(rec["ContextTokens"]), int(rec["GeneratedTokens"])
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"expected TIMESTAMP, ContextTokens, GeneratedTokens: {exc}"
            raise ConfigError([Problem(source, line, "row", problem)]) from None
        start = start or stamp
        rows.append(TraceRow((stamp - start).total_seconds(), max(1, prompt), max(1, output)))
    return rows
