"""The demo's lab (emulated fleet, node agents, load) and its router, each in a process of
its own: the console's process holds neither, requests flow, both stop with the demo, and a
child that dies, or a parent that dies, leaves nothing hanging or behind."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from router.config import load_fleet
from router.demo import Demo, DemoLoad, DemoOptions
from router.demo.channel import (
    ChildMessage,
    ClientTally,
    LabPlan,
    LabReady,
    LoadStopped,
    RateStep,
    RouterPlan,
    RouterReady,
    StartFailed,
    StartLoad,
    StopLoad,
    decode,
    encode,
)
from router.emulator import EmulatedFleet, EmulatedReplica
from router.errors import GpuRouterError
from router.http.server import ListenError
from router.loadgen import LoadGenerator
from router.telemetry.agent import NodeAgent
from tests.demo_cli import (
    WAIT_S,
    banner,
    demo_process,
    lab_children,
    next_line,
    router_children,
)
from tests.demo_helpers import alive, free_port, port_free, two_node_fleet

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads children from /proc")

OPTIONS = DemoOptions(
    time_scale=10,
    listen="127.0.0.1:0",
    admin_listen="127.0.0.1:0",
    load=DemoLoad(low=0.2, high=0.4),
)


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


@asynccontextmanager
async def started_demo(tmp_path: Path, ports: tuple[int, int]) -> AsyncIterator[Demo]:
    demo = Demo(load_fleet(two_node_fleet(tmp_path, ports)), OPTIONS)
    await demo.start()
    try:
        yield demo
    finally:
        await asyncio.wait_for(demo.stop(), WAIT_S)


async def until(check: Callable[[], bool], what: str) -> None:
    """Until ``check()`` is true; fails after WAIT_S (a guard against a hang, not a timing)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not check():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


def lab_objects(besides: list[object] | None = None) -> list[object]:
    """Emulated replicas, node agents and load generators this process holds, other than
    those in ``besides`` (what earlier tests of the session left for the collector)."""
    kinds = (EmulatedFleet, EmulatedReplica, NodeAgent, LoadGenerator)
    old = {id(o) for o in besides or []}  # held alive by ``besides``: their ids stay theirs
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, kinds) and id(o) not in old]


def test_every_message_of_the_channel_reads_back_as_it_was_written() -> None:
    messages: list[ChildMessage] = [
        LabPlan("fleet.yaml", "mqtt://127.0.0.1:1883", 10.0, 3, DemoLoad(low=0.2), 2048),
        LabReady(45.8, (RateStep(150.0, 22.9), RateStep(150.0, 41.2)), 2, "http://h:1"),
        StartFailed("os", "cannot bind", 98),
        StartFailed("config", "not on loopback"),
        ClientTally({"completed": 4, "error": 1}, {"ServerDisconnectedError": 1}, 7),
        LoadStopped(ClientTally({"completed": 5}, {}, 0)),
        StartLoad("http://127.0.0.1:8000", 1234.5),
        StopLoad(),
        RouterPlan("fleet.yaml", "mqtt://h:1", "round-robin", "127.0.0.1:0", None, "t0k"),
        RouterReady("http://127.0.0.1:8000", "http://127.0.0.1:8001"),
        StartFailed("os", "Address in use", 98, "admin API", "127.0.0.1:8001", "x.admin"),
    ]
    for message in messages:
        line = encode(message)
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        assert decode(line) == message


def test_a_line_that_is_no_message_is_refused() -> None:
    for line in (b"[]", b'{"type": "reboot"}', b'{"type": "start_load"}'):
        with pytest.raises(ValueError, match=r"lab message|malformed"):
            decode(line)


async def test_the_lab_and_the_router_run_in_children_of_the_console_process(
    tmp_path: Path,
) -> None:
    """The emulated fleet, the agents and the load are in the lab's process, the router in
    its own, neither in this one; requests flow through the router and are counted over the
    lab's channel and by the router's admin API; the stop leaves no child and no port."""
    replica_ports = (free_port(), free_port())
    earlier = lab_objects()
    async with started_demo(tmp_path, replica_ports) as demo:
        lab_pid, router_pid = demo.lab_pid, demo.router_pid
        assert lab_pid is not None
        assert lab_pid in lab_children(os.getpid())
        assert router_pid in router_children(os.getpid())
        assert lab_objects(besides=earlier) == []
        assert demo.server is None
        await until(lambda: demo.client.get("completed", 0) > 0, "a completed request")
        assert demo.agent_count == 2
        assert demo.fault_url is not None
        used = [demo.front_url, demo.admin_url, demo.fault_url, str(demo.broker_url)]
    assert not alive(lab_pid)
    assert not alive(router_pid)
    summary = demo.summary()["summary"]
    assert summary["client"]["completed"] > 0
    assert summary["outcomes"]["completed"] > 0  # from the router's admin API
    for port in (*replica_ports, *(port_of(url) for url in used)):
        assert port_free(port), f"port {port} is still taken"


async def test_a_lab_killed_with_sigkill_is_reported_and_the_demo_stops(tmp_path: Path) -> None:
    """The demo hears of it at once, with how the lab ended, and its stop does not hang."""
    lost = asyncio.Event()
    async with started_demo(tmp_path, (free_port(), free_port())) as demo:
        demo.on_child_lost = lost.set
        assert demo.lab_pid is not None
        os.kill(demo.lab_pid, signal.SIGKILL)
        await asyncio.wait_for(lost.wait(), WAIT_S)
        assert demo.child_lost is not None
        assert "lab process" in demo.child_lost
        assert "killed by SIGKILL" in demo.child_lost


async def test_a_router_killed_with_sigkill_is_reported_and_the_demo_stops(
    tmp_path: Path,
) -> None:
    lost = asyncio.Event()
    async with started_demo(tmp_path, (free_port(), free_port())) as demo:
        demo.on_child_lost = lost.set
        assert demo.router_pid is not None
        os.kill(demo.router_pid, signal.SIGKILL)
        await asyncio.wait_for(lost.wait(), WAIT_S)
        assert demo.child_lost is not None
        assert "router process" in demo.child_lost
        assert "killed by SIGKILL" in demo.child_lost


async def test_the_headless_demo_exits_with_the_reason_when_its_lab_dies(
    tmp_path: Path,
) -> None:
    async with demo_process(two_node_fleet(tmp_path, (free_port(), free_port()))) as proc:
        await banner(proc)
        await next_line(proc)
        (lab,) = lab_children(proc.pid)
        os.kill(lab, signal.SIGKILL)
        _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 1
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("gpurouter demo: the demo's lab process")
    assert "killed by SIGKILL" in last


async def test_the_headless_demo_exits_with_the_reason_when_its_router_dies(
    tmp_path: Path,
) -> None:
    async with demo_process(two_node_fleet(tmp_path, (free_port(), free_port()))) as proc:
        await banner(proc)
        await next_line(proc)
        (router,) = router_children(proc.pid)
        os.kill(router, signal.SIGKILL)
        _, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
    assert proc.returncode == 1
    last = err.decode().strip().splitlines()[-1]
    assert last.startswith("gpurouter demo: the demo's router process")
    assert "killed by SIGKILL" in last


async def test_the_children_exit_when_the_demo_process_is_killed(tmp_path: Path) -> None:
    """A console that crashes (SIGKILL: no cleanup at all) leaves no lab and no router
    behind: each sees its stdin close and stops, freeing its ports."""
    replica_ports = (free_port(), free_port())
    async with demo_process(two_node_fleet(tmp_path, replica_ports)) as proc:
        urls = await banner(proc)
        await next_line(proc)
        (lab,) = lab_children(proc.pid)
        (router,) = router_children(proc.pid)
        proc.kill()
        await proc.wait()
    await until(lambda: not alive(lab), "the orphaned lab exiting")
    await until(lambda: not alive(router), "the orphaned router exiting")
    router_ports = [port_of(urls[k]) for k in ("front door", "admin API")]
    ports = (*replica_ports, *router_ports)
    await until(lambda: all(port_free(p) for p in ports), "the ports freed")


async def test_a_lab_that_cannot_start_fails_the_demo_with_its_own_error(tmp_path: Path) -> None:
    """The lab's start error (an endpoint the emulator cannot serve) is raised in the
    console's process as the same GpuRouterError it was, and the lab is gone."""
    fleet = two_node_fleet(tmp_path, (free_port(), free_port()))
    fleet.write_text(fleet.read_text().replace("http://127.0.0.1", "http://10.1.2.3", 1))
    demo = Demo(load_fleet(fleet), OPTIONS)
    with pytest.raises(GpuRouterError, match=r"10\.1\.2\.3.* is not on this machine's loopback"):
        await asyncio.wait_for(demo.start(), WAIT_S)
    assert demo.lab_pid is not None  # it ran in the lab's process
    assert not alive(demo.lab_pid)
    assert demo.child_lost is None  # a start error is not a lab lost while running


async def test_a_router_that_cannot_listen_fails_the_demo_with_the_listener_and_setting(
    tmp_path: Path,
) -> None:
    """The router's process cannot take its admin address: the demo's start raises the same
    ListenError it would in this process (so the command names the flag that moves it), and
    no child is left."""
    fleet = load_fleet(two_node_fleet(tmp_path, (free_port(), free_port())))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        options = dataclasses.replace(OPTIONS, admin_listen=address)
        demo = Demo(fleet, options)
        with pytest.raises(ListenError) as caught:
            await asyncio.wait_for(demo.start(), WAIT_S)
    assert (caught.value.listener, caught.value.address) == ("admin API", address)
    assert caught.value.setting == "server.admin_listen"
    assert caught.value.errno == errno.EADDRINUSE
    assert demo.router_pid is not None
    assert demo.lab_pid is not None
    assert not alive(demo.router_pid)
    assert not alive(demo.lab_pid)
