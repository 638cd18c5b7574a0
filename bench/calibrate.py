"""Print the performance model's calibration table, refit its efficiencies, or show figures.

    python bench/calibrate.py            the calibration table docs/performance-model.md holds
    python bench/calibrate.py --fit      the efficiencies that fit router/perf/calibration.yaml
    python bench/calibrate.py --figures  Llama-3.1-8B per GPU at a conversation-like mix

The rows live in router/perf/calibration.yaml; tests/test_perf_model.py checks that the docs
hold exactly the table printed here, and that every row stays within its tolerance.
"""

from __future__ import annotations

import argparse

from router.perf import (
    Deployment,
    ModelDoesNotFit,
    WorkloadMix,
    decode_step_seconds,
    default_catalog,
    prefill_seconds,
    saturation,
)
from router.perf.calibration import calibration_table, fit_efficiency, load_calibration
from router.perf.model import DEFAULT_EFFICIENCY

CONVERSATION = WorkloadMix(prompt_tokens=1155, output_tokens=211)
"""Mean prompt and output of a conversation-like workload."""
PLACEMENTS = [
    ("H200", 1),
    ("H100-SXM", 1),
    ("A100-80GB", 1),
    ("A100-40GB", 1),
    ("L40S", 1),
    ("V100-32GB", 1),
    ("V100-16GB", 1),
    ("A10", 1),
    ("L4", 1),
    ("T4", 1),
    ("T4", 2),
]


def figures_table(model_name: str = "Llama-3.1-8B", mix: WorkloadMix = CONVERSATION) -> str:
    """KV capacity, idle latencies and saturation of ``model_name`` on each placement."""
    catalog = default_catalog()
    lines = [
        "| GPUs | dtype | KV capacity (tokens) | TTFT alone | TPOT alone | batch | step "
        "| capacity (req/s) | output tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gpu, tp in PLACEMENTS:
        try:
            replica = Deployment(catalog.gpu(gpu), catalog.model(model_name), tp)
        except ModelDoesNotFit:
            lines.append(f"| {tp} x {gpu} | | does not fit | | | | | | |")
            continue
        sat = saturation(replica, mix)
        ttft = prefill_seconds(replica, round(mix.prompt_tokens))
        tpot = decode_step_seconds(replica, 1, mix.mean_context_tokens)
        limit = " (KV)" if sat.kv_limited else ""
        lines.append(
            f"| {tp} x {gpu} | {replica.dtype} | {replica.kv_capacity_tokens:,} "
            f"| {ttft * 1000:.0f} ms | {tpot * 1000:.1f} ms | {sat.batch}{limit} "
            f"| {sat.step_seconds * 1000:.0f} ms | {sat.rps:.2f} | {sat.output_tokens_per_s:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the efficiency factors")
    parser.add_argument("--figures", action="store_true", help="Llama-3.1-8B per GPU")
    args = parser.parse_args()
    if args.figures:
        print(figures_table())
        return
    rows = load_calibration()
    if args.fit:
        best, loss = fit_efficiency(rows)
        print(f"fitted: {best} (mean squared log error {loss:.4f})")
        print(f"in use: {DEFAULT_EFFICIENCY}")
        print(calibration_table(rows, best))
    else:
        print(calibration_table(rows))


if __name__ == "__main__":
    main()
