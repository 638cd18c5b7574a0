"""The demo with its console: the Textual app on the demo's loop, quit from the keyboard."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from console.demo_command import demo_app
from router.config import load_fleet
from router.demo import Demo, DemoLoad, DemoOptions
from tests.demo_helpers import free_port, port_free, two_node_fleet


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
        app = demo_app(demo)
        async with app.run_test() as pilot:
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
        app = demo_app(demo)
        async with app.run_test() as pilot:
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
