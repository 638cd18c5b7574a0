"""Every routing strategy on the fleet simulator, as a fraction of the fleet's physical limit.

    python bench/bench_strategies.py                   # the tables (about 4 minutes, one core)
    python bench/bench_strategies.py --json            # the same figures as one JSON document
    python bench/bench_strategies.py --duration 120 --steps 5   # a quicker, coarser look

Four experiments, every strategy in each, on the same seeded arrivals:

1. examples/fleets/mixed-a100-v100.yaml (4 x A100-80GB + 4 x V100-32GB, batch size 256 on
   every card: the engine's own limit, as most deployments leave it), the conv trace's
   length mix, Poisson arrivals: the max sustainable rate (p99 TTFT <= 2 s and the fleet
   keeping up with its arrivals), found by bisection over 0-1.2 x capacity_rps.
2. The same on examples/fleets/mixed-a100-v100-tuned.yaml (V100 batch size 64, what its KV
   cache holds): the router's queue now protects the V100s whatever the strategy.
3. Both mixed fleets at load 0.8 on the code trace's length mix with gamma arrivals
   (burstiness 0.25: inter-arrival times with a coefficient of variation of 2, as
   ``vllm bench serve --burstiness 0.25`` draws them).
4. examples/fleets/h100-a100-l4.yaml (three GPU models) at load 0.8, conv lengths, Poisson.

capacity_rps is the sum of each replica's saturation throughput on the workload's mix,
measured by the simulator alone (router/sim/capacity.py). Beside each static split the table
prints its theoretical share of that limit: a fixed split saturates when the replica with
the least capacity per unit of share is full (round-robin: 8 x a V100's capacity over the
fleet's). "ceiling" is what the fleet serves with every replica held at its configured batch
size: the most any strategy can reach as configured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.sim.capacity import static_split_share
from router.sim.runner import (
    Workload,
    batch_capacity,
    catalog_for,
    fleet_capacity,
    max_sustainable,
    result_dict,
    run_strategy,
    trace_rows,
)
from router.strategies import STRATEGIES

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"
MIXED = FLEETS / "mixed-a100-v100.yaml"
TUNED = FLEETS / "mixed-a100-v100-tuned.yaml"
THREE = FLEETS / "h100-a100-l4.yaml"
BURSTINESS = 0.25
LOAD = 0.8
SLO_TTFT_P99_S = 2.0


def static_shares(fleet: FleetConfig, capacities: Mapping[str, float]) -> dict[str, float]:
    """Theoretical share of capacity for the strategies that split arrivals in fixed shares."""
    uniform = static_split_share(capacities, {r.id: 1.0 for r in fleet.replicas})
    weighted = static_split_share(capacities, {r.id: r.weight for r in fleet.replicas})
    return {
        "round-robin": uniform,
        "random": uniform,
        "weighted-round-robin": weighted,
        "weighted-random": weighted,
    }


class Context:
    """One fleet and workload, with its capacities measured once."""

    def __init__(self, path: Path, workload: Workload, seed: int) -> None:
        self.path = path
        self.fleet = load_fleet(path)
        self.workload = workload
        self.catalog = catalog_for(self.fleet)
        mix = workload.mix
        self.capacities = fleet_capacity(self.fleet, mix, self.catalog, seed=seed)
        self.capacity = sum(self.capacities.values())
        self.ceiling = sum(batch_capacity(self.fleet, mix, self.catalog, seed=seed).values())
        self.theory = static_shares(self.fleet, self.capacities)

    def header(self) -> dict[str, Any]:
        by_model: dict[str, float] = {}
        for r in self.fleet.replicas:
            by_model[r.gpu_model] = round(self.capacities[r.id], 3)
        return {
            "fleet": f"examples/fleets/{self.path.name}",
            "replicas": len(self.fleet.replicas),
            "capacity_rps": round(self.capacity, 3),
            "capacity_rps_per_replica_by_gpu_model": by_model,
            "ceiling_at_batch_sizes": round(self.ceiling / self.capacity, 4),
            "theoretical_share": {k: round(v, 4) for k, v in self.theory.items()},
        }


def sustainable(ctx: Context, duration: float, steps: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for name in sorted(STRATEGIES):
        rate, at = max_sustainable(
            ctx.fleet,
            name,
            ctx.workload,
            ctx.capacity,
            ctx.capacities,
            duration=duration,
            seed=seed,
            slo_ttft_p99_s=SLO_TTFT_P99_S,
            steps=steps,
            catalog=ctx.catalog,
        )
        rows.append(
            {
                "strategy": name,
                "max_sustainable_rps": round(rate, 3),
                "max_sustainable_fraction": round(rate / ctx.capacity, 4),
                "theoretical_share": _round(ctx.theory.get(name)),
                "at_max": None if at is None else result_dict(at, rate, ctx.capacity),
            }
        )
    return rows


def at_load(ctx: Context, load: float, duration: float, seed: int) -> list[dict[str, Any]]:
    rate = load * ctx.capacity
    rows = []
    for name in sorted(STRATEGIES):
        result = run_strategy(
            ctx.fleet, name, ctx.workload, rate, duration, seed, ctx.capacities, ctx.catalog
        )
        rows.append(result_dict(result, rate, ctx.capacity))
    return rows


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# ---- printing -------------------------------------------------------------------------------


def _f(x: object, fmt: str = "{:.3f}") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return fmt.format(x)
    return str(x)


def _util(row: Mapping[str, Any] | None) -> str:
    if not row:
        return "-"
    return " ".join(
        f"{k.split('-')[0]} {v:.2f}" for k, v in row["utilization_by_gpu_model"].items()
    )


def print_header(title: str, ctx: Context) -> None:
    h = ctx.header()
    caps = ", ".join(f"{k} {v:.2f}" for k, v in h["capacity_rps_per_replica_by_gpu_model"].items())
    print(f"\n## {title}")
    print(
        f"{h['fleet']}: capacity_rps {ctx.capacity:.2f} (per replica: {caps}); "
        f"ceiling at the configured batch sizes {h['ceiling_at_batch_sizes']:.3f} of capacity"
    )


def print_sustainable(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'strategy':<27} {'max rps':>8} {'fraction':>8} {'theory':>7} "
        f"{'thr frac':>8} {'ttft p99':>8} {'e2e p99':>8} {'imbal':>6}  utilization at max"
    )
    for r in sorted(rows, key=lambda r: -r["max_sustainable_fraction"]):
        at = r["at_max"] or {}
        print(
            f"{r['strategy']:<27} {r['max_sustainable_rps']:>8.2f} "
            f"{r['max_sustainable_fraction']:>8.3f} {_f(r['theoretical_share']):>7} "
            f"{_f(at.get('capacity_fraction')):>8} {_f(at.get('ttft_p99_s')):>8} "
            f"{_f(at.get('e2e_p99_s'), '{:.1f}'):>8} {_f(at.get('imbalance_factor'), '{:.2f}'):>6}"
            f"  {_util(r['at_max'])}"
        )


def print_at_load(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'strategy':<27} {'thr frac':>8} {'ttft p50':>8} {'ttft p99':>9} "
        f"{'e2e p99':>8} {'imbal':>6} {'lost':>4}  utilization"
    )
    for r in sorted(rows, key=lambda r: _sort_ttft(r["ttft_p99_s"])):
        print(
            f"{r['strategy']:<27} {r['capacity_fraction']:>8.3f} {_f(r['ttft_p50_s']):>8} "
            f"{_f(r['ttft_p99_s'], '{:.2f}') if r['ttft_p99_s'] is not None else 'unbounded':>9} "
            f"{_f(r['e2e_p99_s'], '{:.1f}'):>8} {r['imbalance_factor']:>6.2f} "
            f"{r['lost_requests']:>4}  {_util(r)}"
        )


def _sort_ttft(x: float | None) -> float:
    return float("inf") if x is None else x


def summary(first: list[dict[str, Any]], tuned: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the reading needs: best strategy, round-robin, weighted over uniform."""

    def frac(rows: list[dict[str, Any]], name: str) -> float:
        return float(next(r for r in rows if r["strategy"] == name)["max_sustainable_fraction"])

    out: dict[str, Any] = {}
    for label, rows in (("batch 256", first), ("tuned batch sizes", tuned)):
        best = max(rows, key=lambda r: r["max_sustainable_fraction"])
        rr = frac(rows, "round-robin")
        out[label] = {
            "best": best["strategy"],
            "best_fraction": best["max_sustainable_fraction"],
            "round_robin_fraction": rr,
            "best_over_round_robin": round(best["max_sustainable_fraction"] / rr, 3),
            "weighted_round_robin_over_round_robin": round(
                frac(rows, "weighted-round-robin") / rr, 3
            ),
            "weighted_random_over_random": round(
                frac(rows, "weighted-random") / frac(rows, "random"), 3
            ),
        }
    return out


def experiments(seed: int) -> list[tuple[str, str, str, Context]]:
    """(key, title, kind, context): kind ``search`` finds the max sustainable rate, ``load``
    runs at LOAD x capacity."""
    conv = Workload(trace_rows("conv"))
    code = Workload(trace_rows("code"), "gamma", BURSTINESS)
    return [
        (
            "mixed",
            "Mixed fleet, batch size 256 on every card: max sustainable rate",
            "search",
            Context(MIXED, conv, seed),
        ),
        (
            "mixed_tuned",
            "Mixed fleet, V100 batch size 64: max sustainable rate",
            "search",
            Context(TUNED, conv, seed),
        ),
        (
            "mixed_code_bursty",
            f"Mixed fleet, code lengths, gamma burstiness {BURSTINESS}, load {LOAD}",
            "load",
            Context(MIXED, code, seed),
        ),
        (
            "mixed_tuned_code_bursty",
            f"Mixed fleet, V100 batch size 64, code lengths, gamma burstiness {BURSTINESS}, "
            f"load {LOAD}",
            "load",
            Context(TUNED, code, seed),
        ),
        (
            "three_models",
            f"H100 + A100 + L4 fleet, conv lengths, Poisson, load {LOAD}",
            "load",
            Context(THREE, conv, seed),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="simulated s per run (300)")
    parser.add_argument("--steps", type=int, default=7, help="bisection steps (7: 1%% of capacity)")
    parser.add_argument("--seed", type=int, default=1, help="one seed for every run (1)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    args = parser.parse_args()
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "machine": _machine(),
        "settings": {
            "duration_s": args.duration,
            "search_steps": args.steps,
            "seed": args.seed,
            "slo_ttft_p99_s": SLO_TTFT_P99_S,
            "load": LOAD,
            "burstiness": BURSTINESS,
        },
    }
    for key, title, kind, ctx in experiments(args.seed):
        t = time.perf_counter()
        if kind == "search":
            rows = sustainable(ctx, args.duration, args.steps, args.seed)
        else:
            rows = at_load(ctx, LOAD, args.duration, args.seed)
        report[key] = {**ctx.header(), "rows": rows, "wall_s": round(time.perf_counter() - t, 1)}
        if not args.json:
            print_header(title, ctx)
            (print_sustainable if kind == "search" else print_at_load)(rows)
            print(f"({report[key]['wall_s']:.0f} s)")
    report["summary"] = summary(report["mixed"]["rows"], report["mixed_tuned"]["rows"])
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_summary(report)


def print_summary(report: Mapping[str, Any]) -> None:
    print("\n## Summary")
    for label, s in report["summary"].items():
        print(
            f"{label}: best {s['best']} {s['best_fraction']:.3f} of capacity; "
            f"round-robin {s['round_robin_fraction']:.3f}; "
            f"best / round-robin {s['best_over_round_robin']:.2f}; "
            f"weighted-round-robin / round-robin "
            f"{s['weighted_round_robin_over_round_robin']:.2f}; "
            f"weighted-random / random {s['weighted_random_over_random']:.2f}"
        )
    theory = report["mixed"]["theoretical_share"]
    print(
        f"theory, mixed fleet, strategy alone: round-robin {theory['round-robin']:.3f} "
        f"of capacity, static weights {theory['weighted-round-robin']:.3f}"
    )
    m = report["machine"]
    print(
        f"total {report['wall_s']:.0f} s; {m['nproc']} CPUs, {m['cpu']}; load average "
        f"{m['loadavg'][0]:.2f} at start, {report['loadavg_at_end'][0]:.2f} at end"
    )


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    main()
