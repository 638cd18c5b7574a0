"""How a rollout's commands reach the routers (router/rollout/command_path.py): at once on a
router alone; in order through the operator's path where the router publishes its commands
or hands them to its workers, a failure of that path being a refusal in the trail; and a
rollout that drained a replica here waits for the requests a sibling worker still runs on it
(the load table) before it updates it."""

from __future__ import annotations

import asyncio
import os

from router.control import Applied, Command, ControlSurface, Drain, SetSplit, Undrain
from router.core import RouterCore
from router.errors import ControlError
from router.replica import ReplicaState
from router.rollout.command_path import CommandPath
from router.rollout.executor import Phase, Rollout, RolloutSpec
from router.workers.load_table import LoadTable
from router.workers.shared_load import SharedLoad
from tests.fleet_factory import make_fleet
from tests.test_rollout_executor import NEW, FakeReplicas, FakeUpdater, until


def _surface() -> tuple[ControlSurface, RouterCore]:
    core = RouterCore(make_fleet())
    return ControlSurface(core), core


class Published:
    """Stands for a control link: each command comes back after a yield, then is applied."""

    def __init__(self, control: ControlSurface) -> None:
        self.control = control
        self.given: list[tuple[str, str]] = []
        self.fail: type[Exception] | None = None

    async def __call__(self, command: Command, actor: str) -> Applied:
        self.given.append((type(command).__name__, actor))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail("the broker is gone")
        event = self.control.apply(command, actor=f"mqtt:{actor}")
        return Applied(event, {"router-a": event.ok})


async def test_on_a_router_alone_a_command_is_applied_at_once() -> None:
    control, core = _surface()
    path = CommandPath(control)
    path.send(Drain("r0"), "rollout")
    assert core.replica("r0").state is not ReplicaState.ACTIVE
    event = await path.run(Undrain("r0"), "rollout")
    assert event.ok
    assert [(e.kind, e.actor) for e in control.audit if e.kind != "state"] == [
        ("drain", "rollout"),
        ("undrain", "rollout"),
    ]


async def test_through_the_operators_path_commands_are_applied_in_the_order_given() -> None:
    """A split sent from synchronous code does not overtake a drain awaited before it."""
    control, core = _surface()
    path = CommandPath(control)
    published = Published(control)
    path.apply = published
    drain = asyncio.create_task(path.run(Drain("r0"), "rollout"))
    await asyncio.sleep(0)
    path.send(SetSplit("test-model", "test-model", "test-model-v2", 0.5), "rollout")
    assert core.split is None  # not back yet
    assert (await drain).ok
    await path.settled()
    assert published.given == [("Drain", "rollout"), ("SetSplit", "rollout")]
    assert core.split is not None
    assert core.split.share == 0.5
    kinds = [(e.kind, e.actor) for e in control.audit if e.kind != "state"]
    assert kinds == [("drain", "mqtt:rollout"), ("split", "mqtt:rollout")]


async def test_a_command_the_path_cannot_deliver_is_a_refusal_in_the_trail() -> None:
    control, core = _surface()
    path = CommandPath(control)
    published = Published(control)
    published.fail = ControlError
    path.apply = published
    event = await path.run(Drain("r1"), "rollout")
    assert not event.ok
    assert event.message == "drain not given to every router: the broker is gone"
    assert core.replica("r1").state is ReplicaState.ACTIVE
    assert control.audit[-1].message == event.message
    published.fail = TimeoutError
    late = await path.run(Drain("r1"), "rollout")
    assert "did not come back from the broker in time" in late.message


async def test_a_command_applied_here_alone_while_the_link_is_down_stops_a_rollout() -> None:
    """The operator's path applies a command on this router alone when the control link is
    down (and says so in the log); the rollout's is a refusal then: nobody else drained."""
    control, core = _surface()
    path = CommandPath(control)

    async def link_down(command: Command, actor: str) -> Applied:
        return Applied(control.apply(command, actor=actor))  # routers None: not published

    path.apply = link_down
    event = await path.run(Drain("r2"), "rollout")
    assert not event.ok
    assert "applied on this router alone (the control link is down)" in event.message
    assert core.replica("r2").state is not ReplicaState.ACTIVE  # here it was


async def test_a_drained_replica_is_updated_only_once_a_sibling_worker_has_no_request_on_it() -> (
    None
):
    """Worker 0 runs the rollout; worker 1 (its row of the load table) still holds a
    request on the first replica: the update waits for it."""
    core = RouterCore(make_fleet((2.0, 2.0, 1.0, 1.0)))
    control = ControlSurface(core)
    table = LoadTable.create(2, len(core.pool))
    try:
        core.shared = SharedLoad(table, 0)
        first = "r2"  # weakest first
        table.write(1, core.replica(first).index, 1, 10.0)
        core.snapshot()  # folds the table in, as the router's timer does
        replicas = FakeReplicas(core)
        updater = FakeUpdater(replicas)
        spec = RolloutSpec(NEW, updater, floor=0.6, check_interval_s=0.001)
        rollout = Rollout(spec, core, control, replicas)
        rollout.start()
        await until(lambda: core.replica(first).state is ReplicaState.DRAINED)
        for _ in range(3):  # a few of the executor's looks: it holds on
            await asyncio.sleep(0.06)
        assert updater.done == []
        assert core.replica(first).in_flight == 1
        table.write(1, core.replica(first).index, 0, 0.0)  # worker 1's request ended
        core.snapshot()
        status = await rollout.wait()
        assert status.phase is Phase.DONE
        assert updater.done[0].replica == first
    finally:
        table.close()
        os.close(table.fd)
