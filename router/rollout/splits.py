"""The traffic splits of one router: a canary, or the fleet file's blue-green set, at a time.

The admin API's ``/admin/split`` (and through it ``gpurouter ctl rollout canary ...``,
``switch``, ``switch-back``, ``release``) talks to this: it turns the operator's words into the
canary's (router/rollout/canary.py) and the blue-green set's (router/rollout/blue_green.py)
calls, and builds a canary from a version, its replicas and the ``rollout:`` settings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router.config.loader import parse_rollout_settings
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import RolloutError
from router.rollout.blue_green import BlueGreen, BlueGreenPhase
from router.rollout.canary import Canary, CanaryPhase, CanarySpec, StartRollout
from router.rollout.command_path import CommandPath
from router.rollout.executor import RolloutSpec
from router.rollout.updaters import build_updater

__all__ = ["CANARY_GOING", "SPLIT_ACTIONS", "Splits"]

SPLIT_ACTIONS = ("canary", "step", "promote", "abort", "switch", "switch back", "release")
CANARY_GOING = frozenset({CanaryPhase.PREPARING, CanaryPhase.RUNNING, CanaryPhase.PROMOTING})


class Splits:
    def __init__(
        self,
        core: RouterCore,
        control: ControlSurface,
        start_rollout: StartRollout,
        rollout_going: Callable[[], bool],
        path: CommandPath | None = None,
    ) -> None:
        """``start_rollout``: builds and starts a rollout (the manager's); ``rollout_going``:
        whether a rollout of the whole fleet is under way (a canary waits for it); ``path``:
        how a split, drain or undrain is given (the manager's; by default on this router
        alone)."""
        self.core = core
        self.control = control
        self.path = path if path is not None else CommandPath(control)
        self.start_rollout = start_rollout
        self.rollout_going = rollout_going
        self.canary: Canary | None = None
        """The canary going, or the last one."""
        green = core.fleet.rollout.green
        self.blue_green = None if green is None else BlueGreen(core, control, green, self.path)
        """The fleet file's blue-green set (``rollout.green``), if it declares one."""

    def status(self) -> dict[str, Any] | None:
        if self.blue_green is not None and self.blue_green.phase is not BlueGreenPhase.RELEASED:
            return self.blue_green.status()
        if self.canary is not None:
            return self.canary.status()
        return None if self.blue_green is None else self.blue_green.status()

    async def act(self, action: str, body: Mapping[str, Any], actor: str) -> None:
        """One of ``SPLIT_ACTIONS``; RolloutError when refused, ConfigError for a bad setting.
        Returns once the split, drains and undrains it gave are applied here (where they are
        published, once they came back), so that the state read next shows them."""
        try:
            await self._act(action, body, actor)
        finally:
            await self.path.settled()

    async def _act(self, action: str, body: Mapping[str, Any], actor: str) -> None:
        match action:
            case "canary":
                self.start_canary(body, actor)
            case "step":
                percent = body.get("percent")
                if isinstance(percent, bool) or not isinstance(percent, int | float):
                    raise RolloutError("`step` needs `percent`, a number from 0 to 100")
                self._canary().step(float(percent), actor)
            case "promote":
                await self._canary().promote(actor)
            case "abort":
                await self._canary().abort(actor)
            case "switch":
                self._blue_green().switch(actor)
            case "switch back":
                self._blue_green().switch_back(actor)
            case "release":
                self._blue_green().release(actor)
            case _:
                known = ", ".join(SPLIT_ACTIONS)
                raise RolloutError(f"unknown action {action!r}; known: {known}")

    def start_canary(self, body: Mapping[str, Any], actor: str) -> Canary:
        version = body.get("version")
        if not isinstance(version, str):
            raise RolloutError("a canary needs `version`, the new version's model name")
        if self.canary is not None and self.canary.phase in CANARY_GOING:
            raise RolloutError(f"{self.canary.id} is {self.canary.phase}; one canary at a time")
        bg = self.blue_green
        if bg is not None and bg.phase is not BlueGreenPhase.RELEASED:
            raise RolloutError(f"{bg.id} holds the split; switch and release it first")
        if self.rollout_going():
            raise RolloutError("a rollout is going; a canary starts once it has ended")
        replicas = self._canary_replicas(version, body.get("replicas"))
        model = self._model(replicas, body.get("model"))
        old = self._old_version(model, version, replicas)
        settings = dict(body.get("settings") or {})
        config = parse_rollout_settings(settings, self.core.fleet.rollout)
        updater = None if config.updater is None else build_updater(config.updater)
        rollout = None if updater is None else RolloutSpec.from_config(config, version, updater)
        manual = body.get("manual", False)
        if not isinstance(manual, bool):
            raise RolloutError("`manual` must be true or false")
        rules = config.canary
        spec = CanarySpec(model, old, version, replicas, rules, not manual, updater, rollout)
        canary = Canary(
            spec, self.core, self.control, self.start_rollout, actor=actor, path=self.path
        )
        self.canary = canary
        canary.start()
        return canary

    async def close(self) -> None:
        if self.canary is not None:
            await self.canary.close()
        if self.blue_green is not None:
            self.blue_green.close()

    def _canary(self) -> Canary:
        if self.canary is None:
            raise RolloutError("there is no canary")
        return self.canary

    def _blue_green(self) -> BlueGreen:
        if self.blue_green is None:
            raise RolloutError("the fleet file declares no blue-green set (rollout.green)")
        return self.blue_green

    def _canary_replicas(self, version: str, given: object) -> tuple[str, ...]:
        if given is None:
            running = tuple(r.id for r in self.core.pool if r.version == version)
            if not running:
                raise RolloutError(f"no replica runs {version}: name the canary's `replicas`")
            return running
        if not isinstance(given, list) or not given or not all(isinstance(r, str) for r in given):
            raise RolloutError("`replicas` must be a list of replica ids")
        unknown = [r for r in given if r not in self.core.pool.by_id]
        if unknown:
            raise RolloutError(f"no replica {unknown[0]!r}")
        return tuple(dict.fromkeys(given))

    def _model(self, replicas: Sequence[str], given: object) -> str:
        if given is not None:
            if not isinstance(given, str):
                raise RolloutError("`model` must be a model name")
            return given
        models = {self.core.replica(r).config.model for r in replicas}
        if len(models) != 1:
            raise RolloutError(f"the canary replicas serve several models: {sorted(models)}")
        return models.pop()

    def _old_version(self, model: str, new: str, replicas: Sequence[str]) -> str:
        """The version the rest of the model's replicas run (the most common one)."""
        others = Counter(
            r.version
            for r in self.core.pool
            if r.id not in replicas and r.serves(model) and r.version != new
        )
        if not others:
            raise RolloutError(f"no other replica serves {model}: nothing to compare {new} with")
        return others.most_common(1)[0][0]
