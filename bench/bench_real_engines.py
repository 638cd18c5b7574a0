"""gpurouter in front of real vLLM engines, beside vLLM's and SGLang's own routers.

    python bench/bench_real_engines.py                   # 2 rounds, 3 rates (about 25 min)
    python bench/bench_real_engines.py --rounds 1 --prompts 150   # a quick look
    python bench/bench_real_engines.py --json            # the figures as JSON
    python bench/bench_real_engines.py --rates 1.1 --router "gpurouter default" \
        --router "gpurouter oracle" --default-param wait_weight=20  # a parameter tried

The fleet is the real-engine lab's (docs/real-engines.md): two vLLM for CPU engines serving
tiny models of unequal speed, each pinned to a core of its own, started by this script in a
run directory of its own and stopped at the end. The client is vLLM's own ``vllm bench
serve`` (random 128-token prompts, 128 output tokens, ``--ignore-eos``, Poisson arrivals): the
figures vLLM users quote.

1. Each engine alone, closed loop (``--max-concurrency``): its request rate. Their sum is the
   fleet's capacity; their ratio is the oracle's weights.
2. Per round, per router, started fresh and warmed up: the request rates (fractions of the
   capacity, ``--rates``) in an order rotated per round, routers in an order rotated per
   round: output tokens/s and p99 TTFT, and the share of requests the slow engine completed
   (from the engines' own ``vllm:request_success_total``).

Routers:

- gpurouter, the fleet file as the lab writes it (every weight at 1): the default strategy,
  round-robin, least-connections; and the **oracle**, weighted round-robin with weights equal
  to the measured rates;
- ``vllm-router`` (``power_of_two``, ``cache_aware``) and ``sglang-router`` (``cache_aware``,
  ``power_of_two``), from their wheels in a separate environment under the user's cache
  directory (``gpurouter/bench/rust-routers``), built here if missing; never dependencies of
  gpurouter. A router that cannot be installed or started is skipped with the reason.

The table gives medians over rounds and each figure's ratio to the oracle of the same round.
On a 2-core machine the router and the client share the engines' cores: read the ratios, not
the absolute figures. Run nothing else meanwhile: no real-engine tests, no other engines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from routers_under_test import rust_environment, rust_router_argv  # noqa: E402

from router.lab import Lab, engine_kind, lab_home  # noqa: E402

INPUT_LEN = OUTPUT_LEN = 128
ORACLE = "gpurouter oracle"


# ---- processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``url`` answers 200 (or the process exits, or time is up)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer 200 in {timeout_s:.0f} s")


@dataclass
class Running:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self, n: int = 5) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return " | ".join(lines[-n:])


def spawn(name: str, argv: Sequence[str], url: str, ready: str, workdir: Path) -> Running:
    log = workdir / f"{re.sub(r'[^a-z0-9]+', '-', name)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    running = Running(name, url, proc, log)
    try:
        wait_http(url + ready, 60, proc)
    except RuntimeError as exc:
        running.stop()
        raise RuntimeError(f"{name}: {exc}: {running.tail()}") from None
    return running


# ---- routers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterSpec:
    name: str
    kind: str  # gpurouter | vllm-router | sglang-router
    policy: str
    oracle: bool = False
    params: str = "{}"
    """The strategy's parameters, a YAML flow mapping (gpurouter rows only)."""


ROUTERS = (
    RouterSpec("gpurouter default", "gpurouter", ""),
    RouterSpec("gpurouter round-robin", "gpurouter", "round-robin"),
    RouterSpec("gpurouter least-connections", "gpurouter", "least-connections"),
    RouterSpec(ORACLE, "gpurouter", "weighted-round-robin", oracle=True),
    RouterSpec("vllm-router power_of_two", "vllm-router", "power_of_two"),
    RouterSpec("vllm-router cache_aware", "vllm-router", "cache_aware"),
    RouterSpec("sglang-router cache_aware", "sglang-router", "cache_aware"),
    RouterSpec("sglang-router power_of_two", "sglang-router", "power_of_two"),
)


def default_with(setting: str) -> RouterSpec:
    """The default strategy with one parameter set: ``KEY=VALUE`` (``wait_weight=20``)."""
    key, sep, value = setting.partition("=")
    if not (sep and key.isidentifier() and value):
        raise SystemExit(f"--default-param wants KEY=VALUE, not {setting!r}")
    return RouterSpec(
        f"gpurouter default, {key} {value}",
        "gpurouter",
        "shortest-expected-delay",
        params=f"{{{key}: {value}}}",
    )


def fleet_variant(fleet: Path, spec: RouterSpec, weights: Mapping[str, float], out: Path) -> Path:
    """The lab's fleet file with this spec's strategy (and the oracle's weights)."""
    text = fleet.read_text()
    if spec.oracle:
        for rid, w in weights.items():
            text = re.sub(rf"(id: {re.escape(rid)},.*?weight: )1\b", rf"\g<1>{w:.3f}", text)
    if spec.policy:
        text += f"router:\n  strategy: {{name: {spec.policy}, params: {spec.params}}}\n"
    path = out / f"fleet-{re.sub(r'[^a-z0-9]+', '-', spec.name)}.yaml"
    path.write_text(text)
    return path


def start_router(
    spec: RouterSpec,
    lab: Lab,
    weights: Mapping[str, float],
    rust: Path | None,
    workdir: Path,
) -> Running:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workers = [e.url for e in lab.engines]
    if spec.kind == "gpurouter":
        fleet = fleet_variant(lab.fleet_file, spec, weights, workdir)
        gpurouter = str(Path(sys.executable).with_name("gpurouter"))
        argv = [gpurouter, "serve", "--workers", "1", "--config", str(fleet)]
        argv += ["--listen", f"127.0.0.1:{port}"]
        return spawn(spec.name, argv, url, "/ready", workdir)
    if rust is None:
        raise RuntimeError("the reference routers' environment could not be built")
    argv = rust_router_argv(spec.kind, spec.policy, rust, port, workers)
    return spawn(spec.name, argv, url, "/v1/models", workdir)


# ---- the client ---------------------------------------------------------------------------


@dataclass
class Result:
    router: str
    rate: float
    round: int
    output_tps: float
    request_rps: float
    ttft_p99_ms: float
    completed: int
    failed: int
    slow_share: float | None = None


def bench_serve(
    lab: Lab,
    url: str,
    *,
    prompts: int,
    rate: float | None,
    concurrency: int | None,
    seed: int,
    workdir: Path,
) -> dict[str, Any]:
    """One ``vllm bench serve`` run; its saved result."""
    name = f"result-{time.monotonic_ns()}.json"
    argv = [
        str(lab.environment.python),
        str(lab.environment.launcher),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--model",
        lab.model,
        "--tokenizer",
        str(lab.engines[0].model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_LEN),
        "--random-output-len",
        str(OUTPUT_LEN),
        "--num-prompts",
        str(prompts),
        "--ignore-eos",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    ]
    argv += ["--request-rate", str(rate)] if rate is not None else ["--request-rate", "inf"]
    if concurrency is not None:
        argv += ["--max-concurrency", str(concurrency)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, env=env, check=False, timeout=900)
    path = workdir / name
    if done.returncode or not path.exists():
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {' | '.join(tail)}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def engine_counter(engine_url: str, family: str) -> float:
    """One of the engine's /metrics counters, summed over its labels."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(family)
    )


def successes(engine_url: str) -> float:
    """The engine's ``vllm:request_success_total``, all reasons."""
    return engine_counter(engine_url, "vllm:request_success_total")


# ---- the plan -----------------------------------------------------------------------------


@dataclass
class Plan:
    rates: list[float]
    prompts: int
    rounds: int
    routers: list[RouterSpec]
    alone_prompts: int
    alone_concurrency: int | None
    results: list[Result] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    learned: list[dict[str, Any]] = field(default_factory=list)
    """What gpurouter's default learned of each engine at the end of each of its rounds."""


def rotated(xs: Sequence[Any], k: int) -> list[Any]:
    k %= len(xs)
    return list(xs[k:]) + list(xs[:k])


def measure_alone(lab: Lab, width: int, prompts: int, workdir: Path) -> dict[str, float]:
    """Each engine's request rate alone, a closed loop ``width`` wide."""
    rates = {}
    for engine in lab.engines:
        data = bench_serve(
            lab, engine.url, prompts=prompts, rate=None, concurrency=width, seed=0, workdir=workdir
        )
        rates[engine.name] = float(data["request_throughput"])
        say(f"  {engine.name} alone, {width} wide: {rates[engine.name]:.2f} req/s")
    return rates


def run_router_round(
    spec: RouterSpec,
    lab: Lab,
    plan: Plan,
    rates_rps: Sequence[float],
    weights: Mapping[str, float],
    rust: Path | None,
    rnd: int,
    workdir: Path,
) -> None:
    try:
        router = start_router(spec, lab, weights, rust, workdir)
    except RuntimeError as exc:
        plan.skipped[spec.name] = str(exc)
        return
    slow = min(weights, key=lambda k: weights[k])
    slow_url = next(e.url for e in lab.engines if e.name == slow)
    try:
        # Warm-up at the middle rate, not counted: every router starts from what it knows
        # after a short while in service, gpurouter's learned capacity among it.
        bench_serve(
            lab,
            router.url,
            prompts=max(50, plan.prompts // 3),
            rate=rates_rps[len(rates_rps) // 2],
            concurrency=None,
            seed=1000 + rnd,
            workdir=workdir,
        )
        for rate in rotated(rates_rps, rnd):
            total0 = sum(successes(e.url) for e in lab.engines)
            slow0 = successes(slow_url)
            data = bench_serve(
                lab,
                router.url,
                prompts=plan.prompts,
                rate=rate,
                concurrency=None,
                seed=rnd,
                workdir=workdir,
            )
            total = sum(successes(e.url) for e in lab.engines) - total0
            share = (successes(slow_url) - slow0) / total if total else None
            plan.results.append(
                Result(
                    spec.name,
                    rate,
                    rnd,
                    float(data["output_throughput"]),
                    float(data["request_throughput"]),
                    float(data["p99_ttft_ms"]),
                    int(data["completed"]),
                    int(data.get("failed", plan.prompts - int(data["completed"]))),
                    share,
                )
            )
            if spec.name == "gpurouter default":
                plan.learned.append(learned_capacity(router, rnd, rate))
            say(
                f"  round {rnd + 1} {spec.name} at {rate:.1f} req/s: "
                f"{data['output_throughput']:.0f} tok/s, p99 TTFT {data['p99_ttft_ms']:.0f} ms"
            )
    except RuntimeError as exc:
        plan.skipped.setdefault(spec.name, str(exc))
    finally:
        router.stop()


def learned_capacity(router: Running, rnd: int, rate: float) -> dict[str, Any]:
    """The admin state's learned capacity per engine (req/s, source, completions behind it)."""
    found = re.search(r"admin API on (\S+)", router.log.read_text(errors="replace"))
    if found is None:
        return {"round": rnd, "rate": rate, "replicas": {}}
    with urllib.request.urlopen(found.group(1) + "/admin/state", timeout=5) as r:
        state = json.loads(r.read())
    replicas = {
        s["id"]: {"rps": s.get("capacity_rps"), "source": s.get("capacity_source")}
        for s in state["replicas"]
    }
    return {"round": rnd, "rate": rate, "replicas": replicas}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def lab_up(workdir: Path) -> Iterator[Lab]:
    kind = engine_kind("vllm")
    lab = Lab.up(kind, lab_home(), run_dir=workdir / "lab", count=2, say=say)
    try:
        yield lab
    finally:
        lab.down()


# ---- the report ---------------------------------------------------------------------------


def med(rs: Sequence[Result], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in rs))


def by_cell(plan: Plan) -> dict[tuple[str, float], list[Result]]:
    cells: dict[tuple[str, float], list[Result]] = {}
    for r in plan.results:
        cells.setdefault((r.router, r.rate), []).append(r)
    return cells


def table(plan: Plan) -> list[str]:
    """Medians over rounds; ratios to the oracle are taken per round, then their median."""
    oracle = {(r.rate, r.round): r for r in plan.results if r.router == ORACLE}
    rows = [
        f"{'router':<28} {'req/s':>6} {'tok/s':>7} {'p99 TTFT':>9} {'tok/s/orc':>9} "
        f"{'p99/orc':>8} {'slow share':>10} {'failed':>6}"
    ]
    cells = by_cell(plan)
    for spec in plan.routers:
        for rate in plan.rates:
            rs = cells.get((spec.name, rate))
            if not rs:
                continue
            paired = [(r, oracle[r.rate, r.round]) for r in rs if (r.rate, r.round) in oracle]
            tok = [r.output_tps / o.output_tps for r, o in paired]
            p99 = [r.ttft_p99_ms / o.ttft_p99_ms for r, o in paired]
            shares = [r.slow_share for r in rs if r.slow_share is not None]
            rows.append(
                f"{spec.name:<28} {rate:>6.1f} {med(rs, 'output_tps'):>7.0f} "
                f"{med(rs, 'ttft_p99_ms'):>7.0f}ms {_med(tok):>9} {_med(p99):>8} "
                f"{_med(shares, '{:.0%}'):>10} {sum(r.failed for r in rs):>6}"
            )
    return rows


def _med(xs: Sequence[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(statistics.median(xs)) if xs else "-"


def aims(plan: Plan) -> list[str]:
    """The issue's aims: default >= 0.95 of the oracle's tokens/s, p99 <= 1.1x, at every rate,
    and ahead of both Rust routers on both figures."""
    out = []
    cells = by_cell(plan)
    for rate in plan.rates:
        d = cells.get(("gpurouter default", rate))
        o = cells.get((ORACLE, rate))
        if not d or not o:
            continue
        tok = med(d, "output_tps") / med(o, "output_tps")
        p99 = med(d, "ttft_p99_ms") / med(o, "ttft_p99_ms")
        behind = [
            name
            for (name, rt), rs in cells.items()
            if rt == rate
            and not name.startswith("gpurouter")
            and (
                med(rs, "output_tps") > med(d, "output_tps")
                or med(rs, "ttft_p99_ms") < med(d, "ttft_p99_ms")
            )
        ]
        out.append(
            f"at {rate:.1f} req/s: default/oracle tokens/s {tok:.3f} (aim >= 0.95), p99 TTFT "
            f"{p99:.2f}x (aim <= 1.1); reference routers ahead on either figure: "
            f"{', '.join(behind) or 'none'}"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", default="0.6,0.85,1.1", help="request rates as fractions of capacity"
    )
    parser.add_argument("--prompts", type=int, default=300, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--router", action="append", help="a router row's name (repeatable; default: all)"
    )
    parser.add_argument("--alone-prompts", type=int, default=400)
    parser.add_argument(
        "--alone-concurrency",
        type=int,
        default=16,
        help="closed loop's width for each engine alone (16, as vLLM's users quote it)",
    )
    parser.add_argument(
        "--default-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also run the default strategy with this parameter (repeatable: a row each)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    routers = [r for r in ROUTERS if not args.router or r.name in args.router]
    routers[1:1] = [default_with(setting) for setting in args.default_param]
    plan = Plan(
        [float(x) for x in args.rates.split(",")],
        args.prompts,
        args.rounds,
        routers,
        args.alone_prompts,
        args.alone_concurrency,
    )
    # A SIGTERM unwinds like Ctrl+C, so the engines and routers started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="bench-real-engines-"))
    t0 = time.monotonic()
    try:
        rust = rust_environment(say) if any(r.kind != "gpurouter" for r in routers) else None
        with lab_up(workdir) as lab:
            say("each engine alone (closed loop)")
            # At 64 wide the pair read 34 req/s alone, but routed, with the router and the
            # client on the same two cores, p99 TTFT passed 1.7 s at 29: 16 wide puts the
            # rates where the pair saturates routed.
            lab_batch = lab.state.options.max_num_seqs
            width = plan.alone_concurrency or lab_batch
            alone = measure_alone(lab, width, plan.alone_prompts, workdir)
            capacity = sum(alone.values())
            rates_rps = [round(f * capacity, 1) for f in plan.rates]
            plan.rates = rates_rps
            for rnd in range(plan.rounds):
                for spec in rotated(routers, rnd):
                    run_router_round(spec, lab, plan, rates_rps, alone, rust, rnd, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "engines_alone_rps": alone,
        "alone_width": width,
        "batch_size": lab_batch,
        "capacity_rps": capacity,
        "rates_rps": plan.rates,
        "results": [r.__dict__ for r in plan.results],
        "skipped": plan.skipped,
        "learned": plan.learned,
        "nproc": os.cpu_count(),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"engines alone, {width} wide: "
        f"{', '.join(f'{k} {v:.2f} req/s' for k, v in alone.items())}; "
        f"ratio {max(alone.values()) / min(alone.values()):.2f}; capacity {capacity:.1f} req/s"
    )
    print("\n".join(table(plan)))
    for name, why in plan.skipped.items():
        print(f"skipped {name}: {why}")
    print("\n".join(aims(plan)))
    for seen in plan.learned:
        cells = ", ".join(
            f"{rid} {v['rps'] / alone[rid]:.2f} ({v['source']})"
            for rid, v in seen["replicas"].items()
            if v["rps"] is not None and rid in alone
        )
        at = f"round {seen['round'] + 1} at {seen['rate']} req/s"
        # The learned figure is at the batch size, the rate alone at ``width``: 64 wide the
        # lab's fast engine does 1.4-1.5x what it does 16 wide.
        print(
            f"default, learned capacity ({lab_batch} wide) / rate alone ({width} wide) "
            f"after {at}: {cells}"
        )
    print(f"({report['wall_s']:.0f} s, {os.cpu_count()} cores shared by engines, router, client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
