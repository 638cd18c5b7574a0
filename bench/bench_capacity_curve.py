"""The performance model's curve of throughput against concurrency, against long runs.

    python bench/bench_capacity_curve.py                                  # mixed fleet's cards
    python bench/bench_capacity_curve.py --fleet untuned-wide.yaml --replica h100-0 --replica l4-0

Learned capacity (router/capacity.py) divides what a card did at the concurrency it ran by
the model's efficiency there (router/capacity_prior.py: throughput at ``c`` over throughput
at saturation), so an efficiency that reads low makes the card read high by as much. For each
replica named, the curve as the router builds it on the conv trace's lengths beside the
stepped engine run closed-loop at each concurrency on far more requests (``--measure``), the
two as efficiencies (each over its own best), and their ratio. Seeded: the same figures on any
machine; about 4 s of CPU a replica.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from router.capacity_prior import sample_curve
from router.config import load_fleet
from router.sim.capacity import capacity_at
from router.sim.replica_model import deployment_for, engine_for
from router.sim.runner import catalog_for, trace_rows
from router.sim.workload import TraceMix

FLEETS = Path(__file__).resolve().parent.parent / "examples" / "fleets"
LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fleet", default="mixed-a100-v100.yaml")
    parser.add_argument("--replica", action="append", help="replica id (default: a100-0, v100-0)")
    parser.add_argument("--measure", type=int, default=8000, help="requests a long run counts")
    args = parser.parse_args()
    fleet = load_fleet(FLEETS / args.fleet)
    catalog = catalog_for(fleet)
    rows = trace_rows("conv")
    lengths = tuple(sorted((r.prompt_tokens, r.output_tokens) for r in rows))
    mix = TraceMix(rows)
    for rid in args.replica or ["a100-0", "v100-0"]:
        replica = next((r for r in fleet.replicas if r.id == rid), None)
        if replica is None:
            parser.error(f"{args.fleet} has no replica {rid!r}")
        deployment = replace(deployment_for(replica, catalog), kv_limit=replica.kv_capacity_tokens)
        started = time.process_time()
        curve = sample_curve(deployment, lengths)
        fit_s = time.process_time() - started
        if curve is None:
            print(f"{rid}: the model cannot run the conv trace on this card")
            continue
        top, efficiency = curve
        make = partial(engine_for, replica, catalog)
        long = {
            c: capacity_at(make, mix, c, warmup=max(40, 2 * c), measure=max(args.measure, 32 * c))
            for c in LEVELS
        }
        best = max(long.values())
        print(
            f"\n{rid} ({replica.gpu_model}): saturation {top:.3f} req/s by the curve, "
            f"{best:.3f} by the long runs; the curve took {fit_s:.2f} CPU s"
        )
        print(f"{'at once':>7} {'curve':>7} {'long':>7} {'long/curve':>10}")
        for c in LEVELS:
            ratio = long[c] / best / efficiency[c]
            print(f"{c:>7} {efficiency[c]:>7.3f} {long[c] / best:>7.3f} {ratio:>10.3f}")


if __name__ == "__main__":
    main()
