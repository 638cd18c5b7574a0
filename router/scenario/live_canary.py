"""A scenario's canary step, live: started through the router's own traffic splits (as the
admin API and ``gpurouter ctl rollout canary start`` start one), watched until it ends, and
read back at the end of the run with each replica's own ``/v1/models``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from router.control import Event
from router.errors import ConfigError, RolloutError
from router.rollout.canary import Canary
from router.rollout.splits import Splits
from router.scenario.canary_step import CanaryStep
from router.scenario.live_rollout import served_lists, settle
from router.scenario.recording import CanaryOutcome

__all__ = ["LiveCanary"]

ACTOR = "scenario"


class LiveCanary:
    """The run's one canary: ``start`` at the step's time, ``outcome`` at the end."""

    def __init__(
        self,
        splits: Splits,
        now: Callable[[], float],
        replica_urls: Mapping[str, str],
        body: Callable[[CanaryStep], dict[str, Any]],
    ) -> None:
        """``body``: the admin API's ``canary`` for the step, as this run starts it."""
        self.splits = splits
        self.now = now
        self.replica_urls = dict(replica_urls)
        self.body = body
        self._step: CanaryStep | None = None
        self._canary: Canary | None = None
        self._started_at = 0.0
        self._ended_at: float | None = None
        self._rolled_back_at: float | None = None
        self._watch: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self, step: CanaryStep) -> tuple[bool, str]:
        """Start it; whether the router accepted it, and what it does or why not."""
        try:
            canary = self.splits.start_canary(self.body(step), ACTOR)
        except (RolloutError, ConfigError) as exc:
            return False, str(exc)
        self._step, self._canary, self._started_at = step, canary, self.now()
        self._watch = asyncio.create_task(self._until_ended(canary))
        self._unsubscribe = self.splits.control.subscribe(self._event)
        s = canary.spec
        return True, f"{canary.id}: {s.new} on {', '.join(s.replicas)} beside {s.old}"

    async def _until_ended(self, canary: Canary) -> None:
        await canary.wait()
        self._ended_at = self.now()

    def _event(self, event: Event) -> None:
        """The audit trail's ``rollback`` step of this canary: when the split went to 0%."""
        canary = self._canary
        if (
            canary is not None
            and self._rolled_back_at is None
            and event.kind == "rollout"
            and event.args.get("canary") == canary.id
            and event.args.get("step") == "rollback"
        ):
            self._rolled_back_at = self.now()

    async def settle(self, within_s: float) -> None:
        """Wait up to ``within_s`` seconds for the canary to end (``live_rollout.settle``)."""
        await settle(self._watch, within_s)

    async def outcome(self) -> CanaryOutcome | None:
        """What it did, as it stands now; None when it never started."""
        if self._canary is None or self._step is None:
            return None
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()  # still going: the run ends without it
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        served = await served_lists(self.replica_urls)
        status = self._canary.status()
        return CanaryOutcome(
            self._step.version,
            self._started_at,
            self._ended_at,
            status,
            served,
            rolled_back_at=self._rolled_back_at,
        )
