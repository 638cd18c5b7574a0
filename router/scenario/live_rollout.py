"""A scenario's rollout step, live: started through the router's own rollout manager (as the
admin API and ``gpurouter ctl rollout`` start one), watched until it ends, and read back at
the end of the run with each replica's own ``/v1/models``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from router.errors import ConfigError, RolloutError
from router.http.served_models import (
    MAX_MODELS_BYTES,
    MODELS_PATH,
    ModelListError,
    parse_model_list,
)
from router.rollout.executor import Rollout
from router.rollout.manager import RolloutManager
from router.scenario.recording import RolloutOutcome
from router.scenario.rollout_step import RolloutStep

__all__ = ["LiveRollout", "served_lists", "settle"]

ACTOR = "scenario"
_MODELS_TIMEOUT_S = 5.0


async def settle(watch: asyncio.Task[None] | None, within_s: float) -> None:
    """Wait up to ``within_s`` seconds for a live step's watch to see it end, if it started
    and has not; on time out the watch goes on.

    The simulator runs a rollout or canary on through the scenario's drain window; a live run
    whose last answer came in while one was still moving gives it what is left of that
    window, so that a machine slower than the scenario's clock is judged on the same step.
    """
    if watch is None or watch.done() or within_s <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(watch), within_s)


class LiveRollout:
    """The run's one rollout: ``start`` at the step's time, ``outcome`` at the end."""

    def __init__(
        self,
        manager: RolloutManager,
        now: Callable[[], float],
        replica_urls: Mapping[str, str],
        settings: Callable[[RolloutStep], dict[str, object]],
        time_scale: float = 1.0,
    ) -> None:
        """``settings``: the step's settings as this run starts it (the time scale, the
        emulator's control URL)."""
        self.time_scale = time_scale
        self.manager = manager
        self.now = now
        self.replica_urls = dict(replica_urls)
        self.settings = settings
        self._step: RolloutStep | None = None
        self._rollout: Rollout | None = None
        self._started_at = 0.0
        self._ended_at: float | None = None
        self._watch: asyncio.Task[None] | None = None

    def start(self, step: RolloutStep) -> tuple[bool, str]:
        """Start it; whether the router accepted it, and the plan or why not."""
        try:
            rollout = self.manager.start(step.version, self.settings(step), ACTOR)
        except (RolloutError, ConfigError) as exc:
            return False, str(exc)
        self._step, self._rollout, self._started_at = step, rollout, self.now()
        self._watch = asyncio.create_task(self._until_ended(rollout))
        waves = " | ".join(", ".join(w.replicas) for w in rollout.plan.waves)
        return True, (
            f"{rollout.id}: {step.version} in {len(rollout.plan.waves)} waves ({waves}), "
            f"capacity kept >= {rollout.plan.lowest:.0%}"
        )

    async def _until_ended(self, rollout: Rollout) -> None:
        await rollout.wait()
        self._ended_at = self.now()

    async def settle(self, within_s: float) -> None:
        """Wait up to ``within_s`` seconds for the rollout to end (see ``settle``)."""
        await settle(self._watch, within_s)

    async def outcome(self) -> RolloutOutcome | None:
        """What it did, as it stands now; None when it never started."""
        if self._rollout is None or self._step is None:
            return None
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()  # still going: the run ends without it
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        served = await served_lists(self.replica_urls)
        status = self._rollout.status().to_dict()
        traffic = prediction = None
        if self.manager.current is self._rollout:
            # The router's own accounting and its prediction, in its (wall) seconds: back to
            # scenario seconds at the run's time scale.
            full = self.manager.status() or {}
            traffic = _in_scenario_seconds(full.get("measured"), self.time_scale)
            prediction = _in_scenario_seconds(full.get("prediction"), self.time_scale)
        return RolloutOutcome(
            self._step.version,
            self._started_at,
            self._ended_at,
            status,
            served,
            traffic,
            prediction,
        )


_SECONDS = ("ttft_p99_s", "duration_s", "load_s", "simulated_load_s", "simulated_s")


def _in_scenario_seconds(figures: Any, scale: float) -> dict[str, Any] | None:
    if not isinstance(figures, dict):
        return None
    out = dict(figures)
    for key in _SECONDS:
        if isinstance(out.get(key), int | float):
            out[key] = round(out[key] * scale, 4)
    if isinstance(out.get("arrival_rps"), int | float):
        out["arrival_rps"] = round(out["arrival_rps"] / scale, 3)
    return out


async def served_lists(urls: Mapping[str, str]) -> dict[str, tuple[str, ...] | None]:
    """Each replica's ``/v1/models`` (None: no list), asked at once."""
    timeout = aiohttp.ClientTimeout(total=_MODELS_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(url: str) -> tuple[str, ...] | None:
            try:
                async with session.get(url.rstrip("/") + MODELS_PATH) as answer:
                    if answer.status != 200:
                        return None
                    return parse_model_list(await answer.content.read(MAX_MODELS_BYTES))
            except (aiohttp.ClientError, TimeoutError, ModelListError):
                return None

        lists = await asyncio.gather(*(one(u) for u in urls.values()))
    return dict(zip(urls, lists, strict=True))
