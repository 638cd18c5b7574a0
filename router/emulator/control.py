"""The emulator's control listener: set faults over HTTP while it runs.

- ``GET /faults``: every replica's faults, by id.
- ``POST /faults/<replica>`` with ``{"fault": "kill" | "hang" | "slow" | "fail" | "refuse" |
  "freeze" | "thaw" | "heal" | "revive", "factor": 3.0, "fraction": 0.5, "seed": 7}``: set
  one (``factor`` for ``slow``, ``fraction`` and an optional ``seed`` for ``fail``); answers
  the replica's faults.

- ``GET /versions``: every replica's served version and the one a restart is loading.
- ``POST /versions/<replica>`` with ``{"version": "org/model-v2", "load_s": 2.0}``: restart
  the replica onto that version (router/emulator/versions.py); answers 202 once its port is
  closed, with the versions of the replica, while it loads. 409 while it already restarts.

A refused command answers 400 (404 for an unknown replica) with ``{"error": {"message"}}``.
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

from aiohttp import web

from router.emulator.faults import parse_fault_command
from router.emulator.versions import parse_version_switch
from router.errors import ControlError

if TYPE_CHECKING:
    from router.emulator.fleet import EmulatedFleet

__all__ = ["ControlListener", "build_control_app"]


def build_control_app(fleet: EmulatedFleet) -> web.Application:
    """The control application over ``fleet``."""

    async def list_faults(_: web.Request) -> web.Response:
        return web.json_response(fleet.faults())

    async def set_fault(request: web.Request) -> web.Response:
        replica_id = request.match_info["replica"]
        if replica_id not in fleet.replicas:
            return _refused(404, f"no emulated replica {replica_id!r}")
        try:
            command = parse_fault_command(json.loads(await request.read()))
            await fleet.apply(replica_id, command)
        except ValueError:
            return _refused(400, "the body is not valid JSON")
        except ControlError as exc:
            return _refused(400, str(exc))
        return web.json_response({"replica": replica_id, "faults": fleet.faults()[replica_id]})

    async def list_versions(_: web.Request) -> web.Response:
        return web.json_response(fleet.versions())

    async def switch_version(request: web.Request) -> web.Response:
        replica_id = request.match_info["replica"]
        if replica_id not in fleet.replicas:
            return _refused(404, f"no emulated replica {replica_id!r}")
        try:
            switch = parse_version_switch(json.loads(await request.read()), fleet.load_s)
        except ValueError:
            return _refused(400, "the body is not valid JSON")
        except ControlError as exc:
            return _refused(400, str(exc))
        try:
            await fleet.switch_version(replica_id, switch)
        except ControlError as exc:
            return _refused(409, str(exc))
        versions = fleet.versions()[replica_id]
        return web.json_response({"replica": replica_id, **versions}, status=202)

    app = web.Application()
    app.router.add_get("/faults", list_faults)
    app.router.add_post("/faults/{replica}", set_fault)
    app.router.add_get("/versions", list_versions)
    app.router.add_post("/versions/{replica}", switch_version)
    return app


def _refused(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "control_error"}}, status=status
    )


class ControlListener:
    """The control application on its own port."""

    def __init__(self, fleet: EmulatedFleet) -> None:
        self._fleet = fleet
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; returns the port (useful with 0)."""
        if self._runner is None:
            self._runner = web.AppRunner(
                build_control_app(self._fleet), shutdown_timeout=1.0, access_log=None
            )
            await self._runner.setup()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
        bound = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()
        return bound

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
