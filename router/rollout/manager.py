"""One router's rollouts: at most one going at a time, the latest kept for its status.

The admin API (and later the console and scenarios) talk to this, not to the executor: it
builds a :class:`~router.rollout.executor.RolloutSpec` from the fleet file's ``rollout:``
section and the command's own settings, gives the rollout an HTTP probe and the router's
served-model table, and turns the operator's words (pause, resume, abort, rollback) into the
executor's calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from router.clock import monotonic
from router.config.loader import parse_rollout_settings
from router.config.schema import RolloutConfig, UpdaterConfig
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.rollout.executor import Phase, Rollout, RolloutSpec
from router.rollout.plan import Member, Order, plan_waves
from router.rollout.probe import HttpServingProbe
from router.rollout.updaters import build_updater

__all__ = ["ACTIONS", "RolloutManager"]

ACTIONS = ("start", "pause", "resume", "abort", "rollback")
_GOING = frozenset({Phase.RUNNING, Phase.PAUSED, Phase.ROLLING_BACK})
_PROBE_TIMEOUT_S = 10.0


class RolloutManager:
    def __init__(
        self,
        core: RouterCore,
        control: ControlSurface,
        *,
        learn: Callable[[Replica, tuple[str, ...]], object] | None = None,
    ) -> None:
        self.core = core
        self.control = control
        self.learn = learn
        self.current: Rollout | None = None
        """The rollout going on, or the last one (None before the first)."""
        self._session: aiohttp.ClientSession | None = None

    def status(self) -> dict[str, Any] | None:
        return None if self.current is None else self.current.status().to_dict()

    def start(self, version: str, settings: Mapping[str, Any], actor: str) -> Rollout:
        """Plan and start a rollout of ``version``; RolloutError when it is refused (one is
        going, the plan cannot keep the floor, no updater), ConfigError for a bad setting."""
        spec, _ = self._spec(version, settings)
        rollout = Rollout(
            spec, self.core, self.control, self._probe(), actor=actor, learn=self.learn
        )
        self.current = rollout
        rollout.start()
        return rollout

    def preview(self, version: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`start` would plan now, starting nothing (the console's confirmation):
        the plan, each replica's share of the fleet's learned capacity, and the settings in
        force; the same refusals as ``start``. ``prediction`` is None: nothing predicts yet."""
        spec, config = self._spec(version, settings)
        out = [r.id for r in self.core.pool if r.state is not ReplicaState.ACTIVE]
        if out:
            raise RolloutError(
                f"{out[0]} is {self.core.replica(out[0]).state}; a rollout starts with every "
                "replica in service (undrain or readmit it first)"
            )
        now = monotonic()  # the executor's clock, so the plan is the one start would make
        capacity = {r.id: self.core.capacity.estimate(r, now).rate for r in self.core.pool}
        plan = plan_waves([Member(rid, c) for rid, c in capacity.items()], spec.floor, spec.order)
        total = sum(capacity.values())
        return {
            "version": version,
            "plan": plan.to_dict(),
            "shares": {rid: c / total for rid, c in capacity.items()},
            "settings": {
                "floor": spec.floor,
                "order": spec.order if isinstance(spec.order, str) else list(spec.order),
                "drain_timeout_s": spec.drain_timeout_s,
                "on_drain_timeout": spec.on_drain_timeout,
                "ready_timeout_s": spec.ready_timeout_s,
                "updater": _updater_text(config.updater),
            },
            "prediction": None,
        }

    def _spec(self, version: str, settings: Mapping[str, Any]) -> tuple[RolloutSpec, RolloutConfig]:
        if self.current is not None and self.current.phase in _GOING:
            raise RolloutError(f"{self.current.id} is {self.current.phase}; one rollout at a time")
        own = dict(settings)
        order = _explicit_order(own.pop("order", None), own)
        config = parse_rollout_settings(own, self.core.fleet.rollout)
        if config.updater is None:
            raise RolloutError(
                "no updater: give one in the rollout command or in the fleet file's rollout.updater"
            )
        spec = RolloutSpec.from_config(config, version, build_updater(config.updater))
        if order is not None:
            spec = dataclasses.replace(spec, order=order)
        return spec, config

    async def act(self, action: str, actor: str) -> Rollout:
        """Pause, resume, abort or roll back the current rollout."""
        rollout = self.current
        if rollout is None:
            raise RolloutError("there is no rollout")
        match action:
            case "pause":
                rollout.pause(actor)
            case "resume":
                rollout.resume(actor)
            case "abort":
                rollout.abort(actor)
            case "rollback":
                await rollout.rollback(actor)
            case _:
                raise RolloutError(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
        return rollout

    async def close(self) -> None:
        """The router is stopping: cancel a rollout still going (its replicas' states die
        with this router) and close the probe's session."""
        if self.current is not None:
            await self.current.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _probe(self) -> HttpServingProbe:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return HttpServingProbe(self._session, _PROBE_TIMEOUT_S)


def _updater_text(updater: UpdaterConfig | None) -> str:
    """The updater in a few words; an HTTP body is left out (it may carry a credential)."""
    if updater is not None and updater.command is not None:
        return f"command: {updater.command.run}"
    if updater is not None and updater.http is not None:
        return f"http: {updater.http.method} {updater.http.url}"
    return "none"


def _explicit_order(order: object, settings: dict[str, Any]) -> Order | None:
    """A list is the operator's own order; a string goes to the settings like the rest."""
    if order is None:
        return None
    if isinstance(order, list):
        if not all(isinstance(name, str) for name in order):
            raise RolloutError("'order' must be weakest-first, strongest-first or a list of ids")
        return tuple(order)
    settings["order"] = order
    return None
