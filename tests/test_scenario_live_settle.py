"""A live run gives a rollout or canary still moving what is left of its drain window."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.scenario.live_canary import LiveCanary
from router.scenario.live_rollout import LiveRollout


def _rollout() -> LiveRollout:
    # settle reads nothing but the watch: no manager or splits behind it
    return LiveRollout(manager=object(), now=lambda: 0.0, replica_urls={}, settings=lambda _: {})  # type: ignore[arg-type]


def _canary() -> LiveCanary:
    return LiveCanary(splits=object(), now=lambda: 0.0, replica_urls={}, body=lambda _: {})  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [_rollout, _canary])
async def test_settle_waits_for_the_step_to_end_within_the_time_left(make: Any) -> None:
    step = make()
    ended = asyncio.Event()
    step._watch = asyncio.create_task(ended.wait())
    await step.settle(0.01)
    assert not step._watch.done()  # out of time: returned, and the watch goes on
    asyncio.get_running_loop().call_soon(ended.set)
    await step.settle(60.0)
    assert step._watch.done()
    assert not step._watch.cancelled()


@pytest.mark.parametrize("make", [_rollout, _canary])
async def test_settle_returns_at_once_when_nothing_started_or_no_time_is_left(make: Any) -> None:
    step = make()
    await step.settle(60.0)  # never started: nothing to wait for
    never = asyncio.Event()
    step._watch = asyncio.create_task(never.wait())
    await step.settle(0.0)
    await step.settle(-1.0)
    assert not step._watch.done()
    step._watch.cancel()
