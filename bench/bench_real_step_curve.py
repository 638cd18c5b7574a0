"""How a real vLLM engine's step time grows with the tokens in the step, from its own counters.

    python bench/bench_real_step_curve.py                      # loads 0.3 and 0.5, 60 s each
    python bench/bench_real_step_curve.py --load 0.5 --seconds 90 --json > run.json
    python bench/bench_real_step_curve.py --from-json run.json

Learned capacity of an engine the performance model does not know is an extrapolation: under
light load the router sees the engine run a few requests at once and must say what it does
at its batch size (router/load_curve.py draws a line through what it saw). This bench asks
whether a line can: it reads each engine's own step counters, not the router's.

The fleet is the real-engine lab's (docs/real-engines.md), two vLLM for CPU engines of
unequal speed, one core each; the client is ``vllm bench serve`` (random 128-token prompts,
128 output tokens with ``--ignore-eos``), one per engine, straight at the engine. Every
``--scrape`` seconds each engine's /metrics is read: ``vllm:iteration_tokens_total`` (a
histogram of the tokens each engine step scheduled: its count is the steps, its sum the
tokens), ``vllm:request_success_total`` and ``vllm:num_requests_running``. Per window of at
least ``--window`` seconds and ``MIN_STEPS`` steps: the steps ``S``, the tokens ``N``, and
the seconds the engine was busy (the window's length times the share of its readings with a
request running).

1. Both engines kept full at once (a closed loop as wide as the batch size each, ``--waves``
   batches' worth of requests): the saturated steps, their mean tokens and duration,
   requests a second.
2. Poisson arrivals at each ``--load`` of the saturated rate, for ``--seconds``: a
   least-squares fit of ``busy = a * S + b * N`` over the windows (a step costs ``a`` plus
   ``b`` a token), then what that line says of the saturated windows' busy time from their
   own steps and tokens, over what it was.
3. Saturated again, to see how far the machine moved meanwhile.

A ratio of 1 says the line through the light load's steps holds at saturation; above 1
says the engine batches better at saturation than the line says, and a capacity read from
light load through a line reads low by that factor. Run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_real_engines import bench_serve, lab_up, say  # noqa: E402

from router.lab import Lab  # noqa: E402

STEPS = "vllm:iteration_tokens_total_count"
TOKENS = "vllm:iteration_tokens_total_sum"
SUCCESSES = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
READ = (STEPS, TOKENS, SUCCESSES, RUNNING)
SATURATED = ("saturated", "saturated again")
MIN_STEPS = 10
"""Steps a window spans at least: a step is counted where it ends, so this bounds what a
window's edges misplace to a tenth."""


def read_counters(engine_url: str) -> dict[str, float]:
    """The engine's values of ``READ``, each summed over its labels."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    values = dict.fromkeys(READ, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


@dataclass(frozen=True)
class Window:
    busy_s: float
    steps: float
    tokens: float


class Scraper:
    """Reads every engine's counters every ``every_s`` seconds, in a thread, tagged with the
    phase under way."""

    def __init__(self, lab: Lab, every_s: float) -> None:
        self.lab, self.every_s = lab, every_s
        self.phase = ""
        self.rows: dict[str, list[tuple[str, float, dict[str, float]]]] = {
            e.name: [] for e in lab.engines
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            for e in self.lab.engines:
                self.rows[e.name].append((self.phase, time.monotonic(), read_counters(e.url)))

    def windows(self, engine: str, phase: str, per: int) -> list[Window]:
        """The phase cut into windows of at least ``per`` readings and ``MIN_STEPS`` steps: a
        step is counted in the window it ends in, so a window a few steps long would carry
        another's time (a prefill of 64 prompts on the slow engine is a few steps of seconds
        each, with readings between that see no step end)."""
        rows = [(t, v) for p, t, v in self.rows[engine] if p == phase]
        out = []
        start = 0
        for end in range(1, len(rows)):
            (t0, a), (t1, b) = rows[start], rows[end]
            steps = b[STEPS] - a[STEPS]
            if end - start < per or steps < MIN_STEPS:
                continue
            running = [v[RUNNING] for _, v in rows[start : end + 1]]
            busy = sum(1 for x in running if x > 0) / len(running)
            out.append(Window((t1 - t0) * busy, steps, b[TOKENS] - a[TOKENS]))
            start = end
        return out


def phase_rate(rows: Sequence[tuple[str, float, dict[str, float]]], phase: str) -> float:
    """Requests a second over a phase: its completions over the time from the last reading
    before the engine's first step of the phase (the client takes a while to start) to the
    first reading that saw the last completion (a closed loop of equal requests completes
    them in waves of the batch size, which windows would cut off)."""
    mine = [(t, v[STEPS], v[SUCCESSES]) for p, t, v in rows if p == phase]
    if len(mine) < 2 or mine[-1][2] <= mine[0][2]:
        return 0.0
    begin = next(i for i, (_, steps, _) in enumerate(mine) if steps > mine[0][1])
    end = next(t for t, _, done in mine if done == mine[-1][2])
    return (mine[-1][2] - mine[0][2]) / (end - mine[max(begin - 1, 0)][0])


def fit_line(windows: Sequence[Window]) -> tuple[float, float] | None:
    """``(a, b)`` of ``busy = a * steps + b * tokens``, least squares (the normal equations)."""
    ss = sum(w.steps * w.steps for w in windows)
    sn = sum(w.steps * w.tokens for w in windows)
    nn = sum(w.tokens * w.tokens for w in windows)
    sy = sum(w.steps * w.busy_s for w in windows)
    ny = sum(w.tokens * w.busy_s for w in windows)
    det = ss * nn - sn * sn
    if det <= 0:
        return None
    return (sy * nn - ny * sn) / det, (ss * ny - sn * sy) / det


def summary(windows: Sequence[Window]) -> dict[str, float]:
    steps = sum(w.steps for w in windows)
    return {
        "windows": len(windows),
        "tokens_per_step": sum(w.tokens for w in windows) / steps,
        "step_ms": 1000 * sum(w.busy_s for w in windows) / steps,
    }


def run_phase(
    lab: Lab, scraper: Scraper, phase: str, load: Callable[[str], dict[str, Any]]
) -> None:
    """``load(engine name)`` gives ``bench_serve``'s keyword arguments; one client per engine,
    all at once."""
    scraper.phase = phase
    threads = [
        threading.Thread(target=bench_serve, kwargs={"lab": lab, "url": e.url, **load(e.name)})
        for e in lab.engines
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def measure(lab: Lab, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    width = lab.state.options.max_num_seqs
    with Scraper(lab, args.scrape) as scraper:

        def saturated(_: str) -> dict[str, Any]:
            prompts = width * args.waves
            return {
                "prompts": prompts,
                "rate": None,
                "concurrency": width,
                "seed": 3,
                "workdir": workdir,
            }

        run_phase(lab, scraper, SATURATED[0], saturated)
        per = max(1, round(args.window / args.scrape))
        rates = {e.name: phase_rate(scraper.rows[e.name], SATURATED[0]) for e in lab.engines}
        say("saturated: " + ", ".join(f"{k} {v:.2f} req/s" for k, v in rates.items()))
        for load in args.load:

            def poisson(name: str, load: float = load) -> dict[str, Any]:
                return {
                    "prompts": max(1, int(rates[name] * load * args.seconds)),
                    "rate": rates[name] * load,
                    "concurrency": None,
                    "seed": 5,
                    "workdir": workdir,
                }

            run_phase(lab, scraper, f"load {load}", poisson)
        run_phase(lab, scraper, SATURATED[1], saturated)
    return {
        name: {
            phase: {
                "rps": phase_rate(scraper.rows[name], phase),
                "windows": [w.__dict__ for w in scraper.windows(name, phase, per)],
            }
            for phase in [SATURATED[0], *(f"load {x}" for x in args.load), SATURATED[1]]
        }
        for name in scraper.rows
    }


def report(data: dict[str, dict[str, dict[str, Any]]]) -> None:
    for engine, phases in data.items():
        windows = {p: [Window(**w) for w in ph["windows"]] for p, ph in phases.items()}
        full = [w for p in SATURATED for w in windows[p]]
        print(f"{engine}")
        print(
            f"  {'phase':<16} {'windows':>7} {'tok/step':>8} {'step ms':>8} {'req/s':>6}"
            f"  {'a ms':>6} {'b ms/tok':>8}  line at saturation / measured"
        )
        for phase, ws in windows.items():
            s = summary(ws)
            line = "" if phase in SATURATED else _line_cells(ws, full)
            print(
                f"  {phase:<16} {s['windows']:>7.0f} {s['tokens_per_step']:>8.1f} "
                f"{s['step_ms']:>8.1f} {phases[phase]['rps']:>6.2f}{line}"
            )


def _line_cells(ws: Sequence[Window], full: Sequence[Window]) -> str:
    fitted = fit_line(ws)
    if fitted is None:
        return "  (no line)"
    a, b = fitted
    said = sum(a * w.steps + b * w.tokens for w in full)
    took = sum(w.busy_s for w in full)
    return f"  {1000 * a:>6.1f} {1000 * b:>8.3f}  {said / took:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--load",
        type=float,
        action="append",
        help="fraction of the saturated rate (0.3 and 0.5); repeatable",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of each load")
    parser.add_argument(
        "--waves", type=int, default=4, help="batches' worth of requests each saturated phase sends"
    )
    parser.add_argument("--scrape", type=float, default=0.2, help="seconds between readings")
    parser.add_argument("--window", type=float, default=1.0, help="seconds a window")
    parser.add_argument("--json", action="store_true", help="print the windows as JSON")
    parser.add_argument("--from-json", type=Path, help="print the table of a --json run")
    args = parser.parse_args()
    if args.from_json is not None:
        report(json.loads(args.from_json.read_text()))
        return
    args.load = args.load or [0.3, 0.5]
    with tempfile.TemporaryDirectory(prefix="gpurouter-steps-") as tmp, lab_up(Path(tmp)) as lab:
        data = measure(lab, args, Path(tmp))
    if args.json:
        print(json.dumps(data))
    else:
        report(data)


if __name__ == "__main__":
    main()
