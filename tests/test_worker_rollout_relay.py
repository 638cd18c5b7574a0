"""Whichever worker of ``gpurouter serve --workers N`` is asked, ``/admin/rollout`` and
``/admin/split`` are worker 0's: another worker's private API relays them there as they are.
Two routers in this process stand for two workers, each with its private API on a Unix
socket, in front of an emulated blue-green fleet."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.emulator import EmulatedFleet
from router.http.server import RouterServer
from router.rollout.blue_green import BlueGreenPhase
from router.workers.private_api import PrivateApi
from router.workers.worker_client import WorkerClient, socket_path
from tests.http_support import routed_fleet
from tests.test_emulator_support import any_ports
from tests.test_split_admin import SPECS, _blue_green


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[list[RouterServer]]:
    config = _blue_green()
    async with (
        EmulatedFleet(config, time_scale=100.0, ports=any_ports(SPECS)) as emulated,
        AsyncExitStack() as stack,
    ):
        servers = []
        for index in (0, 1):
            private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            private.bind(str(socket_path(tmp_path, index)))
            private.listen(16)
            server = RouterServer(
                routed_fleet(config, emulated), listen="127.0.0.1:0", admin_socket=private
            )
            client = WorkerClient(tmp_path, 2)
            stack.push_async_callback(client.close)
            server.admin_app = PrivateApi(server.admin, index, server.metrics.render, client)
            await server.start()
            stack.push_async_callback(server.stop, 0)
            servers.append(server)
        yield servers


async def _ask(path: Path, method: str, route: str, **body: Any) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(path))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(method, f"http://worker{route}", json=body or None) as answer,
    ):
        return answer.status, await answer.json()


async def test_another_worker_relays_the_split_and_the_rollout_to_worker_0(
    workers: list[RouterServer], tmp_path: Path
) -> None:
    zero, one = workers
    status, answer = await _ask(socket_path(tmp_path, 1), "POST", "/admin/split", action="switch")
    assert status == 200, answer
    assert answer["split"]["phase"] == "switched"
    assert zero.rollouts.splits.blue_green is not None
    assert zero.rollouts.splits.blue_green.phase is BlueGreenPhase.SWITCHED
    assert one.rollouts.splits.blue_green is not None
    assert one.rollouts.splits.blue_green.phase is BlueGreenPhase.BLUE  # its own never ran
    _, split = await _ask(socket_path(tmp_path, 1), "GET", "/admin/split")
    assert split["split"]["id"] == zero.rollouts.splits.blue_green.id
    refused, answer = await _ask(socket_path(tmp_path, 1), "POST", "/admin/rollout", action="pause")
    assert refused == 409
    assert answer["error"]["message"] == "there is no rollout"
