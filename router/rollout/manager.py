"""One router's rollouts: at most one going at a time, the latest kept for its status.

The admin API (and the console and scenarios) talk to this, not to the executor: it
builds a :class:`~router.rollout.executor.RolloutSpec` from the fleet file's ``rollout:``
section and the command's own settings, gives the rollout an HTTP probe and the router's
served-model table, and turns the operator's words (pause, resume, abort, rollback) into the
executor's calls.

:meth:`RolloutManager.preview` answers what a start would do and cost without starting
anything (the plan and the simulator's prediction, router/rollout/preview.py); a started
rollout keeps its prediction and is measured by the router's own accounting
(router/rollout/meter.py), so its status sets the two side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import aiohttp

from router.config.loader import parse_rollout_settings
from router.config.schema import RolloutConfig
from router.control import ControlSurface
from router.core import RouterCore
from router.errors import GpuRouterError, RolloutError
from router.replica import Replica
from router.rollout.command_path import CommandPath
from router.rollout.executor import Phase, Rollout, RolloutSpec
from router.rollout.meter import RolloutMeter
from router.rollout.plan import Order
from router.rollout.predict import FleetState, Prediction, fleet_state, predict
from router.rollout.preview import (
    RolloutPreview,
    live_plan,
    live_settings,
    live_shares,
    sim_spec,
)
from router.rollout.probe import HttpServingProbe
from router.rollout.simulated import SimRolloutSpec
from router.rollout.splits import CANARY_GOING, Splits
from router.rollout.templates import VERSION_NAME
from router.rollout.updaters import Target, build_updater

__all__ = ["ACTIONS", "RolloutManager"]

ACTIONS = ("start", "preview", "pause", "resume", "abort", "rollback")
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
        self.prediction: Prediction | None = None
        """What the simulator predicted for the current rollout (None while it works)."""
        self.prediction_error: str | None = None
        self.meter: RolloutMeter | None = None
        """What the current rollout costs the traffic, by the router's own accounting."""
        self._predicting: asyncio.Task[None] | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._session: aiohttp.ClientSession | None = None
        self.path = CommandPath(control)
        """How its rollouts' and splits' drains, undrains and splits are given: on this router
        alone, unless the server sets ``path.apply`` to the way it gives an operator's command
        (published to the cluster, or to every worker of the service)."""
        self.splits = Splits(core, control, self.run, self.going, self.path)
        """The canary or blue-green traffic split (``/admin/split``)."""

    def going(self) -> bool:
        """Whether a rollout is under way (running, paused or rolling back)."""
        return self.current is not None and self.current.phase in _GOING

    def status(self) -> dict[str, Any] | None:
        """The current (or last) rollout's state and progress, with its prediction (None
        while it is worked out, or when it could not be) and what it has cost the traffic so
        far (``measured``; final once it ended and the requests that arrived during it did)."""
        if self.current is None:
            return None
        status = self.current.status()
        out = status.to_dict()
        out["prediction"] = None if self.prediction is None else self.prediction.to_dict()
        if self.prediction_error is not None:
            out["prediction_error"] = self.prediction_error
        meter = self.meter
        out["measured"] = None if meter is None else meter.figures(status.capacity_lowest).to_dict()
        return out

    def start(self, version: str, settings: Mapping[str, Any], actor: str) -> Rollout:
        """Plan and start a rollout of ``version``; RolloutError when it is refused (one is
        going, the plan cannot keep the floor, no updater, not a model name), ConfigError for
        a bad setting. Its prediction is worked out beside it (in a worker process: the router
        goes on) from the fleet as it was at the start, and its cost to the traffic measured."""
        if self.current is not None and self.current.phase in _GOING:
            raise RolloutError(f"{self.current.id} is {self.current.phase}; one rollout at a time")
        canary = self.splits.canary
        if canary is not None and canary.phase in CANARY_GOING:
            raise RolloutError(f"{canary.id} is {canary.phase}; a rollout waits for it to end")
        spec, config = self._spec(version, settings)
        state = fleet_state(self.core)  # before the first drain changes it
        rollout = self.run(spec, actor)
        self._predicting = asyncio.create_task(
            self._predict(rollout, state, sim_spec(spec, config))
        )
        return rollout

    def run(self, spec: RolloutSpec, actor: str = "rollout") -> Rollout:
        """Build and start a rollout as the current one, its cost to the traffic measured (a
        canary's rollouts come here too, so ``ctl rollout status`` follows them);
        RolloutError when it cannot be planned."""
        rollout = Rollout(
            spec,
            self.core,
            self.control,
            self._probe(),
            actor=actor,
            learn=self.learn,
            path=self.path,
        )
        self.current = rollout
        self.prediction, self.prediction_error = None, None
        meter = RolloutMeter(self.core)
        self.meter = meter
        rollout.start().add_done_callback(lambda _: meter.close())
        return rollout

    async def preview(self, version: str, settings: Mapping[str, Any]) -> RolloutPreview:
        """The plan and the prediction of a rollout of ``version`` with ``settings`` (the
        keys of the fleet file's ``rollout:``, as :meth:`start` takes them), as it would run
        now; nothing is started, drained or recorded. Refused as :meth:`start` refuses it:
        RolloutError (the plan cannot keep the floor, a replica is out of service, no
        updater, not a model name), ConfigError for a bad setting. The prediction runs in a
        worker process, bounded (router/rollout/predict.py's ``Budget``: a few seconds at most)."""
        spec, config = self._spec(version, settings)
        plan = live_plan(self.core, spec)
        prediction, error = await self._prediction_of(
            fleet_state(self.core), sim_spec(spec, config)
        )
        r = self.core.replica(plan.order[0])
        target = Target(r.id, r.config.node, r.config.endpoint, version)
        updater = spec.updater.describe(target)
        return RolloutPreview(
            version,
            plan,
            prediction,
            config.load_estimate_s,
            updater,
            shares=live_shares(self.core),
            settings=live_settings(spec, config),
            prediction_error=error,
        )

    def _spec(self, version: str, settings: Mapping[str, Any]) -> tuple[RolloutSpec, RolloutConfig]:
        if not isinstance(version, str) or not VERSION_NAME.match(version):
            raise RolloutError(f"{version!r} is not a model name such as org/model-v2")
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

    async def _predict(self, rollout: Rollout, state: FleetState, spec: SimRolloutSpec) -> None:
        prediction, error = await self._prediction_of(state, spec)
        if self.current is rollout:
            self.prediction, self.prediction_error = prediction, error

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
        await self.path.close()
        if self._predicting is not None:
            await asyncio.gather(self._predicting, return_exceptions=True)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _prediction_of(
        self, state: FleetState, spec: SimRolloutSpec
    ) -> tuple[Prediction | None, str | None]:
        """The prediction, or None and why not: the simulated plan refused what the live one
        took, or the simulator cannot run the fleet (a GPU or model the performance model
        does not know, as the real-engine lab's). A rollout is planned and run without one."""
        try:
            return await self._predicted(state, spec), None
        except GpuRouterError as exc:
            return None, f"no prediction: {exc}"

    async def _predicted(self, state: FleetState, spec: SimRolloutSpec) -> Prediction:
        """The prediction, worked out in a worker process: a thread would share the
        interpreter's lock with the router's loop, which then stalls while relaying streams
        (router/capacity_prior.py's ``ProcessFitter`` found the same)."""
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            # As ProcessFitter: the resource tracker needs the process's own stderr (under
            # the console sys.stderr is a capture without a descriptor).
            with contextlib.redirect_stderr(sys.__stderr__):
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, predict, state, spec)
        except BrokenProcessPool:
            self._pool = None  # a new worker takes the next one
            raise RolloutError("the prediction's worker process died; ask again") from None

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
