"""The demo with its console: the Textual app attached to the demo's router, quit from the
keyboard, and leaving by itself when a child process dies."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from console.demo_command import demo_console
from console.screens.strategy_picker import StrategyPicker
from router.config import load_fleet
from router.core import RouterCore
from router.demo import Demo, DemoLoad, DemoOptions
from router.strategies import STRATEGIES
from tests.demo_cli import WAIT_S, router_children
from tests.demo_helpers import free_port, listening_ports, port_free, two_node_fleet

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads processes from /proc")


async def test_ctrl_c_in_the_demo_console_quits_and_the_demo_stops_clean(
    tmp_path: Path,
) -> None:
    """Ctrl+C quits the console (as q does); then the demo stops and frees every port."""
    ports = (free_port(), free_port())
    options = DemoOptions(
        time_scale=10,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        load=DemoLoad(low=0.2, high=0.4),
    )
    demo = Demo(load_fleet(two_node_fleet(tmp_path, ports)), options)
    await demo.start()
    try:
        async with demo_console(demo) as app, app.run_test() as pilot:
            assert any("front door: " + demo.front_url in n for n in app.backend.notes)
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert app.return_code == 0  # set by app.exit: the app is leaving
        broker = demo.broker
        used = (demo.front_url, demo.admin_url)
    finally:
        await demo.stop()
    assert broker is not None
    assert not broker.running
    for port in (*ports, *(int(url.rsplit(":", 1)[1]) for url in used)):
        assert port_free(port), f"port {port} is still taken"


async def test_the_demo_console_quits_by_itself_when_the_lab_process_dies(
    tmp_path: Path,
) -> None:
    """Killed lab, nothing left to watch: the console leaves (the command then prints why
    and exits 1) instead of showing a fleet that no longer runs."""
    options = DemoOptions(
        time_scale=10,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        load=DemoLoad(low=0.2, high=0.4),
    )
    demo = Demo(load_fleet(two_node_fleet(tmp_path, (free_port(), free_port()))), options)
    await demo.start()
    try:
        async with demo_console(demo) as app, app.run_test() as pilot:
            assert demo.lab_pid is not None
            os.kill(demo.lab_pid, signal.SIGKILL)
            for _ in range(600):  # a guard against a hang only (60 s)
                if app.return_code is not None:
                    break
                await pilot.pause(0.1)
            assert app.return_code == 0  # set by app.exit: the app is leaving
    finally:
        await demo.stop()
    assert demo.child_lost is not None
    assert "killed by SIGKILL" in demo.child_lost


async def test_the_demo_console_holds_no_router_and_its_keys_reach_the_router_process(
    tmp_path: Path,
) -> None:
    """The console's process is what a production console is: no router core in it and no
    front door or admin API listening in it (the router's own process listens on both); a
    strategy picked with `s` reaches that process through its admin API, with the token,
    under the console's name in the audit trail."""
    options = DemoOptions(
        time_scale=10,
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        load=DemoLoad(low=0.2, high=0.4),
    )
    earlier = router_cores()
    demo = Demo(load_fleet(two_node_fleet(tmp_path, (free_port(), free_port()))), options)
    await demo.start()
    try:
        async with demo_console(demo) as app, app.run_test() as pilot:
            assert demo.router_pid in router_children(os.getpid())
            assert router_cores(besides=earlier) == []
            router_ports = {port_of(demo.front_url), port_of(demo.admin_url)}
            assert router_ports <= listening_ports(demo.router_pid)
            assert not router_ports & listening_ports(os.getpid())

            names = list(STRATEGIES)
            steps = names.index("least-connections") - names.index("round-robin")
            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, StrategyPicker)
            await pilot.press(*["down" if steps > 0 else "up"] * abs(steps), "enter")
            state = await router_state(demo)
            for _ in range(600):  # a guard against a hang only (60 s)
                if state["strategy"] == "least-connections":
                    break
                await pilot.pause(0.1)
                state = await router_state(demo)
            assert state["strategy"] == "least-connections"
            trail = await router_events(demo)
            switch = [e for e in trail if e["kind"] == "strategy"]
            assert [(e["actor"], e["ok"]) for e in switch] == [("demo-console", True)]
    finally:
        await demo.stop()
    assert [s["strategy"] for s in demo.summary()["summary"]["strategy_switches"]] == [
        "least-connections"
    ]


def router_cores(besides: list[object] | None = None) -> list[object]:
    """Router cores this process holds, other than those in ``besides`` (what earlier tests
    of the session left for the collector)."""
    old = {id(o) for o in besides or []}  # held alive by ``besides``: their ids stay theirs
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, RouterCore) and id(o) not in old]


def port_of(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


async def router_state(demo: Demo) -> dict[str, Any]:
    return await admin_get(demo, "/admin/state")


async def router_events(demo: Demo) -> list[dict[str, Any]]:
    events = (await admin_get(demo, "/admin/events"))["events"]
    assert isinstance(events, list)
    return events


async def admin_get(demo: Demo, path: str) -> dict[str, Any]:
    """``path`` of the demo's admin API, asked with its token, as ``ctl`` would."""
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        headers = {"Authorization": f"Bearer {demo.admin_token}"}
        response = await client.get(demo.admin_url + path, headers=headers)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data
