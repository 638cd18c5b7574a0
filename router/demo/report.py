"""What the demo prints: one JSON object per second and a summary at the end.

Both are plain dicts of JSON types, built from the router's snapshot, the telemetry status
and the load generator's tally; nothing here touches sockets or clocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

from router.snapshot import FleetSnapshot
from router.telemetry.status import TelemetryStatus

__all__ = ["ENDINGS", "RunTally", "StrategySwitch", "snapshot_line", "stop_outcomes"]


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def snapshot_line(
    t: float,
    snap: FleetSnapshot,
    status: TelemetryStatus,
    *,
    offered_rps: float,
    client: Counter[str],
) -> dict[str, Any]:
    """The fleet at ``t`` seconds into the demo (rates are per wall-clock second)."""
    return {
        "t": round(t, 1),
        "strategy": snap.strategy,
        "offered_rps": _r(offered_rps, 2),
        "arrivals_rps": _r(snap.arrivals_rps, 2),
        "throughput_rps": _r(snap.throughput_rps, 2),
        "queue_depth": snap.queue.depth,
        "in_flight": snap.in_flight,
        "imbalance_factor": _r(snap.imbalance_factor),
        "band": str(snap.band),
        "outcomes": dict(snap.outcomes),
        "client": dict(client),
        "replicas": {
            r.id: {
                "state": r.state,
                "gpu_model": r.gpu_model,
                "utilization": _r(r.utilization),
                "utilization_from_telemetry": r.utilization_from_telemetry,
                "telemetry_age_s": _r(r.telemetry_age_s, 2),
                "in_flight": r.in_flight,
                "load": _r(r.load),
                "throughput_rps": _r(r.throughput_rps, 2),
            }
            for r in snap.replicas
        },
        "telemetry": {
            "broker": str(status.broker),
            "nodes": {
                n.node: {
                    "fresh": n.age_s is not None and not n.stale,
                    "online": n.online,
                    "age_s": _r(n.age_s, 2),
                    "samples": n.samples,
                }
                for n in status.nodes
            },
        },
    }


@dataclass(frozen=True, slots=True)
class StrategySwitch:
    t: float
    """Seconds into the demo."""
    strategy: str
    actor: str


@dataclass(slots=True)
class RunTally:
    """Per-second lines and strategy switches, summed up at the end."""

    throughput: list[float] = field(default_factory=list)
    imbalance: list[tuple[str, float]] = field(default_factory=list)
    """(strategy, imbalance factor) of each second."""
    switches: list[StrategySwitch] = field(default_factory=list)

    def add(self, line: dict[str, Any]) -> None:
        self.throughput.append(float(line["throughput_rps"]))
        self.imbalance.append((str(line["strategy"]), float(line["imbalance_factor"])))

    def summary(
        self,
        duration_s: float,
        outcomes: dict[str, int],
        client: Counter[str],
        errors: Counter[str] | None = None,
        at_stop: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """``outcomes``: the router's endings; ``client``: the load generator's (``error`` is
        a request that got no HTTP answer at all: lost); ``errors``: what those died of;
        ``at_stop``: the router's endings when the operator stopped the demo (what ended
        otherwise than completed after it is counted ``stopped``, not failed)."""
        by_strategy = _means_by_strategy(self.imbalance)
        throughput_by_strategy = _means_by_strategy(
            [(name, rps) for (name, _), rps in zip(self.imbalance, self.throughput, strict=True)]
        )
        factors = [f for _, f in self.imbalance]
        return {
            "summary": {
                "duration_s": round(duration_s, 1),
                "outcomes": stop_outcomes(outcomes, at_stop),
                "client": dict(client),
                "lost": client.get("error", 0),
                "lost_by_error": dict(errors or {}),
                "mean_throughput_rps": _r(fmean(self.throughput), 2) if self.throughput else 0.0,
                "throughput_rps_by_strategy": {
                    k: _r(v, 2) for k, v in throughput_by_strategy.items()
                },
                "imbalance": {
                    "mean": _r(fmean(factors)) if factors else None,
                    "max": _r(max(factors)) if factors else None,
                    "by_strategy": {k: _r(v) for k, v in by_strategy.items()},
                },
                "strategy_switches": [
                    {"t": round(s.t, 1), "strategy": s.strategy, "actor": s.actor}
                    for s in self.switches
                ],
            }
        }


ENDINGS = ("completed", "failed", "rejected", "expired")


def stop_outcomes(final: Mapping[str, int], at_stop: Mapping[str, int] | None) -> dict[str, int]:
    """The router's endings, with those the operator's stop brought about as ``stopped``.

    A request still running when the demo is stopped is cut off after a short drain, and the
    router records it as failed (its client went away): not a failure of the fleet. So every
    ending after ``at_stop`` other than a completion counts as ``stopped``; completions count
    as completions whenever they came.
    """
    if at_stop is None:
        return {k: final.get(k, 0) for k in ENDINGS}
    out = {k: at_stop.get(k, 0) for k in ENDINGS}
    out["completed"] = final.get("completed", 0)
    ended_after = sum(final.values()) - sum(at_stop.values())
    out["stopped"] = ended_after - (out["completed"] - at_stop.get("completed", 0))
    return out


def _means_by_strategy(samples: list[tuple[str, float]]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for name, value in samples:
        groups.setdefault(name, []).append(value)
    return {k: fmean(v) for k, v in groups.items()}
