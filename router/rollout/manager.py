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

from router.config.loader import parse_rollout_settings
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import RolloutError
from router.replica import Replica
from router.rollout.executor import Phase, Rollout, RolloutSpec
from router.rollout.plan import Order
from router.rollout.probe import HttpServingProbe
from router.rollout.splits import CANARY_GOING, Splits
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
        self.splits = Splits(core, control, self.run, self.going)
        """The canary or blue-green traffic split (``/admin/split``)."""

    def going(self) -> bool:
        """Whether a rollout is under way (running, paused or rolling back)."""
        return self.current is not None and self.current.phase in _GOING

    def status(self) -> dict[str, Any] | None:
        return None if self.current is None else self.current.status().to_dict()

    def start(self, version: str, settings: Mapping[str, Any], actor: str) -> Rollout:
        """Plan and start a rollout of ``version``; RolloutError when it is refused (one is
        going, the plan cannot keep the floor, no updater), ConfigError for a bad setting."""
        if self.current is not None and self.current.phase in _GOING:
            raise RolloutError(f"{self.current.id} is {self.current.phase}; one rollout at a time")
        canary = self.splits.canary
        if canary is not None and canary.phase in CANARY_GOING:
            raise RolloutError(f"{canary.id} is {canary.phase}; a rollout waits for it to end")
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
        return self.run(spec, actor)

    def run(self, spec: RolloutSpec, actor: str = "rollout") -> Rollout:
        """Build and start a rollout as the current one (a canary's rollouts come here, so
        ``ctl rollout status`` follows them too); RolloutError when it cannot be planned."""
        rollout = Rollout(
            spec, self.core, self.control, self._probe(), actor=actor, learn=self.learn
        )
        self.current = rollout
        rollout.start()
        return rollout

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
        await self.splits.close()
        if self.current is not None:
            await self.current.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _probe(self) -> HttpServingProbe:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return HttpServingProbe(self._session, _PROBE_TIMEOUT_S)


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
