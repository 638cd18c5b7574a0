"""Engine /metrics parsing: what one replica's page costs the router's event loop.

    python bench/bench_engine_metrics.py             # the table
    python bench/bench_engine_metrics.py --quick     # fewer rounds (a smoke run)

The router reads every replica's ``/metrics`` each ``engine_metrics_interval_s`` (2 s by
default) and parses it on its event loop (router/telemetry/engine_metrics.py). The page is
the emulator's, fetched over loopback from an emulated H100 replica: vLLM 0.32's families,
histograms included, as the emulator contract test holds them to
(tests/test_emulator_contract.py). Rows, interleaved round by round in one process:

- ``whole page``: ``parse_engine_metrics`` with every line handed to prometheus_client's
  parser, as it did before it picked the lines it reads by name;
- ``lines read``: ``parse_engine_metrics`` as it is.

``ms a page`` is the median over rounds of the mean over a round; ``replicas a core`` is how
many replicas one core could poll at the default interval with nothing else to do
(interval / time a page), the ceiling the parse alone puts on a router.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from router.config import load_fleet
from router.config.schema import HealthConfig
from router.emulator import EmulatedFleet
from router.telemetry import engine_metrics

FLEET = (
    Path(__file__).resolve().parent.parent / "examples" / "fleets" / "untuned-four-generations.yaml"
)


async def _page() -> str:
    fleet = load_fleet(FLEET)
    async with EmulatedFleet(fleet, ports={r.id: 0 for r in fleet.replicas}) as emu:
        replica = emu.replicas["h100-0"]
        async with httpx.AsyncClient() as client:
            return (await client.get(replica.url + "/metrics")).text


def _whole_page(text: str) -> engine_metrics.EngineReading:
    read_lines = engine_metrics._read_lines
    engine_metrics._read_lines = lambda text: text  # every line to the parser
    try:
        return engine_metrics.parse_engine_metrics(text)
    finally:
        engine_metrics._read_lines = read_lines


def _round(parse: Callable[[str], engine_metrics.EngineReading], text: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        parse(text)
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds, per_round = (3, 20) if args.quick else (15, 100)
    text = asyncio.run(_page())
    rows = {"whole page": _whole_page, "lines read": engine_metrics.parse_engine_metrics}
    readings = {name: parse(text) for name, parse in rows.items()}
    assert readings["whole page"] == readings["lines read"], readings
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, parse in rows.items():
            times[name].append(_round(parse, text, per_round))
    interval = HealthConfig().engine_metrics_interval_s
    size, lines = len(text.encode()), text.count("\n")
    print(f"page: {size:,} bytes, {lines} lines (an emulated H100, vLLM's families)")
    print(f"{'parse':<12} {'ms a page':>9} {'replicas a core':>16} {'vs whole page':>14}")
    base = statistics.median(times["whole page"])
    for name in rows:
        ms = statistics.median(times[name])
        print(f"{name:<12} {ms * 1000:>9.2f} {interval / ms:>16,.0f} {base / ms:>13.1f}x")
    print(f"{rounds} rounds of {per_round} parses each, interleaved; interval {interval:g} s")


if __name__ == "__main__":
    main()
