"""What gpurouter learns of real vLLM engines' capacity, against what each measurably does.

    python bench/bench_real_capacity.py                  # 2 rounds at load 0.5, 60 s each
    python bench/bench_real_capacity.py --rounds 3 --load 0.3 --json
    python bench/bench_real_capacity.py --load 0.5 --load 0.9   # each load's rounds in turn

The fleet is the real-engine lab's (docs/real-engines.md): two vLLM for CPU engines serving
tiny models of unequal speed, each pinned to a core of its own; the lab's fleet file, every
weight at 1, every batch size at the engines' ``--max-num-seqs``. The client is vLLM's own
``vllm bench serve`` (random 128-token prompts, 128 output tokens, ``--ignore-eos``).

1. Each engine alone, closed loop as wide as its batch size: its rate at saturation, the
   figure learned capacity estimates (the rate at the batch size the router allows).
2. Every engine kept full through gpurouter at once (a closed loop as wide as all their
   batch sizes), each engine's output counted by its own ``vllm:generation_tokens_total``
   over ``--window`` seconds, in requests of 128 tokens: what each does while routed. On
   this machine the router and the client share the engines' cores, so this is less than
   alone, and it is what the router's accounting can see. It is measured before the first
   round and again after every round: a shared host's speed moved by a fifth within ten
   minutes (2026-11-30), so each round is read against the two measurements on either side
   of it (their mean), and the lines say how far those two lay apart.
3. Per round, a fresh ``gpurouter serve`` with the default strategy, Poisson arrivals at
   ``--load`` times the sum of the rates kept full just before, for ``--seconds``; the
   router's admin state is read every ``--every`` seconds: each engine's learned capacity
   (requests per second at the workload's mean request), its source, and the measurement and
   prior it blends, over the engine's rate kept full around that round; the last lines
   compare it with that rate and with the rate alone.

The aim (issue 20): within 10% of each engine's rate after 60 s. On a 2-core machine the
router and the client share the engines' cores: run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_real_engines import (  # noqa: E402
    OUTPUT_LEN,
    ROUTERS,
    RouterSpec,
    Running,
    bench_serve,
    engine_counter,
    measure_alone,
    say,
    start_router,
)
from bench_real_engines import lab_up as real_lab_up  # noqa: E402

from console.view.capacity import at_once_count  # noqa: E402
from router.lab import Lab  # noqa: E402

DEFAULT = ROUTERS[0]
AIM = 0.10
SETTLE_S = 10.0
"""Seconds a saturating load runs before its window opens (every engine full by then; on a
host without bf16 in its vector unit the slow engine prefills its first 64 prompts for about
40 s: ``--settle``)."""
WINDOW_S = 30.0
"""Seconds over which a saturated engine's completions are counted (``--window``)."""


def measure_routed(
    lab: Lab,
    alone: dict[str, float],
    workdir: Path,
    settle_s: float = SETTLE_S,
    window_s: float = WINDOW_S,
) -> dict[str, float]:
    """Each engine's request rate with every engine kept full through gpurouter at once: a
    closed loop as wide as all their batch sizes, each engine's output counted by its own
    ``vllm:generation_tokens_total`` over the middle of the run. On a machine where the
    router and the client share the engines' cores, this is what each engine does while
    routed, which is what the router can measure; alone, it does more."""
    width = lab.state.options.max_num_seqs * len(lab.engines)
    expected = sum(alone.values())
    router = start_router(
        RouterSpec("gpurouter saturated", "gpurouter", "least-connections"), lab, {}, None, workdir
    )
    counts: dict[str, float] = {}
    try:
        load = threading.Thread(
            target=bench_serve,
            kwargs={
                "lab": lab,
                "url": router.url,
                "prompts": int(expected * (settle_s + window_s + 15)),
                "rate": None,
                "concurrency": width,
                "seed": 7,
                "workdir": workdir,
            },
            daemon=True,
        )
        load.start()
        time.sleep(settle_s)
        before = {e.name: generated(e.url) for e in lab.engines}
        t0 = time.monotonic()
        time.sleep(window_s)
        counts = {e.name: generated(e.url) - before[e.name] for e in lab.engines}
        elapsed = time.monotonic() - t0
        load.join()
    finally:
        router.stop()
    rates = {k: v / OUTPUT_LEN / elapsed for k, v in counts.items()}
    for k, v in rates.items():
        say(f"  {k} kept full through gpurouter beside the others: {v:.2f} req/s")
    return rates


def generated(engine_url: str) -> float:
    """The engine's ``vllm:generation_tokens_total``. Tokens, not requests: a closed loop of
    equal requests completes them in waves of the batch size, 64 at a time on the slow
    engine every 10 s or so, so a 30 s window counted 2 or 3 waves."""
    return engine_counter(engine_url, "vllm:generation_tokens_total")


class Watcher:
    """Reads the router's learned capacity every ``every_s`` seconds, in a thread."""

    def __init__(self, router: Running, every_s: float) -> None:
        self.router = router
        self.every_s = every_s
        self.readings: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = time.monotonic()

    def __enter__(self) -> Watcher:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s - (time.monotonic() - self._start) % self.every_s):
            reading = {"at_s": round(time.monotonic() - self._start), "replicas": self._read()}
            self.readings.append(reading)

    def _read(self) -> dict[str, dict[str, Any]]:
        """Each replica's learned capacity from the admin state, with the prior and the
        measurement it blends."""
        found = re.search(r"admin API on (\S+)", self.router.log.read_text(errors="replace"))
        if found is None:
            return {}
        with urllib.request.urlopen(found.group(1) + "/admin/state", timeout=5) as r:
            state = json.loads(r.read())
        return {
            s["id"]: {
                "rps": s.get("capacity_rps"),
                "source": s.get("capacity_source"),
                "prior_rps": s.get("capacity_prior_rps"),
                "measured_rps": s.get("capacity_measured_rps"),
                "at_once": s.get("capacity_measured_concurrency"),
                "in_flight": s.get("in_flight"),
            }
            for s in state["replicas"]
        }


def one_round(
    lab: Lab,
    rates: dict[str, float],
    args: argparse.Namespace,
    load: float,
    rnd: int,
    workdir: Path,
) -> list[dict[str, Any]]:
    """A fresh router under Poisson load at ``load`` of the summed rates; its readings."""
    router = start_router(DEFAULT, lab, {}, None, workdir)
    try:
        with Watcher(router, args.every) as watcher:
            rate = load * sum(rates.values())
            bench_serve(
                lab,
                router.url,
                prompts=int(rate * args.seconds),
                rate=rate,
                concurrency=None,
                seed=100 + rnd,
                workdir=workdir,
            )
    finally:
        router.stop()
    return watcher.readings


def ratio(reading: dict[str, Any], rid: str, key: str, alone: float) -> float | None:
    value = reading["replicas"].get(rid, {}).get(key)
    return None if value is None else float(value) / alone


def around(rnd: dict[str, Any]) -> dict[str, float]:
    """Each engine's rate kept full around a round: the mean of the measurements just before
    and just after it."""
    before, after = rnd["before"], rnd["after"]
    return {k: (before[k] + after[k]) / 2 for k in before}


def _cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(
    refs: dict[str, Any],
    rounds: dict[float, list[dict[str, Any]]],
    seconds: float,
) -> None:
    alone = refs["alone"]
    print("each engine alone, as wide as its batch size: " + _rates(alone))
    for i, kept in enumerate(refs["routed"]):
        when = "before the first round" if i == 0 else f"after round {i}"
        print(f"each engine kept full through gpurouter beside the other, {when}: {_rates(kept)}")
    for load, its_rounds in rounds.items():
        print(f"-- at {load} of the summed routed rates")
        report_load(alone, its_rounds, seconds)


def _rates(rates: dict[str, float]) -> str:
    return ", ".join(f"{k} {rates[k]:.2f} req/s" for k in sorted(rates))


def report_load(alone: dict[str, float], rounds: list[dict[str, Any]], seconds: float) -> None:
    names = sorted(alone)
    print(
        "over each engine's rate kept full through gpurouter around the round: learned "
        "(source), measurement (@N: a figure for N at once, short of its batch), prior"
    )
    print(f"{'round':>5} {'at s':>5} " + " ".join(f"{k:>38}" for k in names))
    at_end: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {k: [] for k in names}
    for i, rnd in enumerate(rounds, 1):
        routed = around(rnd)
        for reading in rnd["readings"]:
            cells = []
            for k in names:
                rep = reading["replicas"].get(k, {})
                learned, measured, prior = (
                    ratio(reading, k, key, routed[k])
                    for key in ("rps", "measured_rps", "prior_rps")
                )
                at_once = rep.get("at_once")
                short = "" if at_once is None or measured is None else f"@{at_once_count(at_once)}"
                cells.append(
                    f"{_cell(learned)} ({rep.get('source', '-')}) m {_cell(measured)}{short} "
                    f"p {_cell(prior)}".rjust(38)
                )
            print(f"{i:>5} {reading['at_s']:>5} " + " ".join(cells))
        last = [x for x in rnd["readings"] if x["at_s"] <= seconds + 1]
        for k in names:
            if last and last[-1]["replicas"].get(k, {}).get("rps") is not None:
                at_end[k].append((rnd, last[-1]))
    for k in names:
        drift = [rnd["after"][k] / rnd["before"][k] for rnd, _ in at_end[k]]
        if drift:
            print(
                f"{k}, kept full after each round over before it: "
                + ", ".join(f"{d:.2f}" for d in drift)
            )
    for label, ref_of in (
        ("kept full through gpurouter around the round", around),
        ("kept full just before the round", lambda rnd: rnd["before"]),
        ("kept full just after the round", lambda rnd: rnd["after"]),
        ("alone", lambda _: alone),
    ):
        for k in names:
            vs = [
                v for rnd, r in at_end[k] if (v := ratio(r, k, "rps", ref_of(rnd)[k])) is not None
            ]
            if not vs:
                continue
            verdict = "within" if max(abs(v - 1) for v in vs) <= AIM else "NOT within"
            print(
                f"{k}, learned at {seconds:.0f} s over its rate {label}: "
                f"{', '.join(f'{v:.2f}' for v in vs)}; {verdict} {AIM:.0%} in every round"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--load",
        type=float,
        action="append",
        help="fraction of the summed rates (0.5); repeat it for rounds at each load in turn",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of load a round")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between readings")
    parser.add_argument("--alone-prompts", type=int, default=400)
    parser.add_argument(
        "--settle", type=float, default=SETTLE_S, help="seconds kept full before counting"
    )
    parser.add_argument(
        "--window", type=float, default=WINDOW_S, help="seconds a kept-full engine is counted"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    loads = args.load or [0.5]
    with tempfile.TemporaryDirectory(prefix="gpurouter-capacity-") as tmp:
        workdir = Path(tmp)
        with real_lab_up(workdir) as lab:
            say("each engine alone (closed loop)")
            width = lab.state.options.max_num_seqs
            alone = measure_alone(lab, width, args.alone_prompts, workdir)
            say("every engine kept full through gpurouter at once")
            kept = [measure_routed(lab, alone, workdir, args.settle, args.window)]
            rounds: dict[float, list[dict[str, Any]]] = {load: [] for load in loads}
            for load in loads:
                for rnd in range(args.rounds):
                    say(f"round {rnd + 1}: gpurouter default at {load} of their rates")
                    readings = one_round(lab, kept[-1], args, load, rnd, workdir)
                    say("every engine kept full through gpurouter at once, again")
                    kept.append(measure_routed(lab, alone, workdir, args.settle, args.window))
                    rounds[load].append(
                        {"readings": readings, "before": kept[-2], "after": kept[-1]}
                    )
            refs = {"alone": alone, "routed": kept}
    if args.json:
        print(json.dumps({"rates_rps": refs, "rounds": rounds, "args": vars(args)}, indent=1))
    else:
        report(refs, rounds, args.seconds)


if __name__ == "__main__":
    main()
