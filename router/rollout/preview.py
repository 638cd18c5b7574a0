"""A rollout shown before it starts: its plan and what the simulator predicts it will cost.

:func:`live_plan` is the plan a rollout would run now (the same checks as the executor: every
replica in service, the floor kept on the learned capacities); :func:`sim_spec` is the
simulated rollout of the same settings, whose load time is the settings' ``load_estimate_s``
(a command or HTTP updater's real time is not known before it runs).
:class:`RolloutPreview` is the pair the admin API's ``preview``, ``gpurouter ctl rollout start
--dry-run`` and the console's confirmation show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.config.schema import RolloutConfig, UpdaterConfig
from router.core import RouterCore
from router.errors import RolloutError
from router.replica import ReplicaState
from router.rollout.executor import RolloutSpec
from router.rollout.plan import Member, Plan, plan_waves
from router.rollout.predict import Prediction
from router.rollout.simulated import SimRolloutSpec

__all__ = ["RolloutPreview", "live_plan", "live_settings", "live_shares", "sim_spec"]


@dataclass(frozen=True, slots=True)
class RolloutPreview:
    """What a rollout would do, and what it is predicted to cost, before it starts."""

    version: str
    plan: Plan
    """The waves, in order, each with the share of capacity it leaves in service."""
    prediction: Prediction | None
    """The simulator's forecast: lowest capacity in service, peak router queue, p99 TTFT of
    the requests arriving during it, and its duration. None when the simulator cannot run
    this fleet (a GPU or model the performance model does not know): ``prediction_error``."""
    load_s: float
    """Each replica's time out of service the prediction counts (``load_estimate_s``)."""
    updater: str
    """How each replica would be updated, in words (the first to go: its command or request)."""
    shares: Mapping[str, float]
    """Each replica's share of the fleet's learned capacity, as the plan read it."""
    settings: Mapping[str, Any]
    """The settings in force (the operator's over the fleet file's ``rollout:``)."""
    prediction_error: str | None = None
    """Why there is no prediction (the plan stands without one)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "plan": self.plan.to_dict(),
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
            "prediction_error": self.prediction_error,
            "load_s": self.load_s,
            "updater": self.updater,
            "shares": dict(self.shares),
            "settings": dict(self.settings),
        }


def live_shares(core: RouterCore) -> dict[str, float]:
    """Each replica's share of the fleet's learned capacity now (what the plan reads)."""
    now = core.clock()
    rates = {r.id: core.capacity.estimate(r, now).rate for r in core.pool}
    total = sum(rates.values())
    return {rid: rate / total if total > 0 else 0.0 for rid, rate in rates.items()}


def live_settings(spec: RolloutSpec, config: RolloutConfig) -> dict[str, Any]:
    """The settings a rollout of ``spec`` runs with, as the console's confirmation shows them."""
    return {
        "floor": spec.floor,
        "order": spec.order if isinstance(spec.order, str) else list(spec.order),
        "drain_timeout_s": spec.drain_timeout_s,
        "on_drain_timeout": spec.on_drain_timeout,
        "ready_timeout_s": spec.ready_timeout_s,
        "updater": _updater_text(config.updater),
    }


def _updater_text(updater: UpdaterConfig | None) -> str:
    """The updater in a few words; an HTTP body is left out (it may carry a credential)."""
    if updater is not None and updater.command is not None:
        return f"command: {updater.command.run}"
    if updater is not None and updater.http is not None:
        return f"http: {updater.http.method} {updater.http.url}"
    return "none"


def live_plan(core: RouterCore, spec: RolloutSpec) -> Plan:
    """The plan a rollout of ``spec`` would run on ``core`` now; RolloutError (PlanError)
    when it would be refused: a replica out of service, the floor out of reach."""
    out = [r for r in core.pool if r.state is not ReplicaState.ACTIVE]
    if out:
        raise RolloutError(
            f"{out[0].id} is {out[0].state}; a rollout starts with every replica in service "
            "(undrain or readmit it first)"
        )
    now = core.clock()
    members = [Member(r.id, core.capacity.estimate(r, now).rate) for r in core.pool]
    return plan_waves(members, spec.floor, spec.order)


def sim_spec(spec: RolloutSpec, config: RolloutConfig) -> SimRolloutSpec:
    """The simulated rollout of ``spec``, out of service for ``config.load_estimate_s``."""
    return SimRolloutSpec(
        version=spec.version,
        load_s=config.load_estimate_s,
        floor=spec.floor,
        order=spec.order,
        drain_timeout_s=spec.drain_timeout_s,
        on_drain_timeout=spec.on_drain_timeout,
        check_interval_s=spec.check_interval_s,
    )
