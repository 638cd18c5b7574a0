"""A worker's side of its supervisor's own API (supervisor_api.py), used only without a control
link (``--no-telemetry``): the service's desired state, applied as the worker starts, before
its front door opens; and the way the worker that runs the service's rollouts gives their
drains, undrains, preemptions and splits, so that every worker applies them (the supervisor
gives each one to every worker and keeps it for a worker that starts later)."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import orjson

from router.control import (
    Applied,
    Command,
    ControlSurface,
    Event,
    command_args,
    command_name,
    parse_command,
)
from router.errors import ControlError
from router.workers.worker_client import service_socket_path

__all__ = ["SupervisorClient"]

log = logging.getLogger("gpurouter.workers")

TIMEOUT_S = 15.0
"""A command goes to every worker (each bounded by the supervisor's own 5 s) before the
supervisor answers."""


class SupervisorClient:
    def __init__(self, directory: Path, index: int) -> None:
        self.path = service_socket_path(directory)
        self.index = index
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.path)),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
            )
        return self._session

    async def apply(self, command: Command, actor: str) -> Applied:
        """Give ``command`` to every worker through the supervisor: this worker's own
        application of it, and which workers applied it (``worker K``: True). ControlError
        when the supervisor does not answer, or answers what is not an application."""
        body = orjson.dumps({"command": command_name(command), **command_args(command)})
        headers = {"content-type": "application/json", "x-actor": actor}
        url = f"http://supervisor/service/commands?worker={self.index}"
        try:
            async with self._client().post(url, data=body, headers=headers) as response:
                status, data = response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ControlError(
                f"the supervisor did not answer: {exc or type(exc).__name__}"
            ) from None
        answer = _json(data)
        event = _event(answer) if status in (200, 409) else None
        if event is None:
            error = answer.get("error")
            why = error.get("message") if isinstance(error, dict) else None
            raise ControlError(f"the supervisor answered {status}: {why or data[:200]!r}")
        workers = answer.get("workers")
        routers = (
            {f"worker {k}": v == 200 for k, v in workers.items()}
            if isinstance(workers, dict)
            else None
        )
        return Applied(event, routers)

    async def catch_up(self, control: ControlSurface) -> int:
        """Apply the service's desired state (the commands given to the workers before this
        one started, the last on each slot, oldest first), actor ``restored:<actor>``; how many.
        A supervisor that does not answer leaves the worker on the fleet file's settings,
        said in the log."""
        url = f"http://supervisor/service/desired?worker={self.index}"
        try:
            async with self._client().get(url) as response:
                status, data = response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("the supervisor did not answer (%s): starting from the fleet file", exc)
            return 0
        desired = _json(data).get("desired")
        if status != 200 or not isinstance(desired, list):
            log.warning("the supervisor answered %d for the desired state: not applied", status)
            return 0
        applied = 0
        for item in desired:
            try:
                command = parse_command(item["command"])
                actor = str(item["actor"])
            except (ControlError, KeyError, TypeError):
                log.warning("a desired-state entry from the supervisor is unreadable: %r", item)
                continue
            control.apply(command, actor=f"restored:{actor}")
            applied += 1
        return applied

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _event(answer: dict[str, object]) -> Event | None:
    """The event a worker's ``/admin/commands`` answered, as the supervisor relayed it."""
    seq, at, actor, kind = (
        answer.get("seq"),
        answer.get("at"),
        answer.get("actor"),
        answer.get("kind"),
    )
    args, ok, message = answer.get("args"), answer.get("ok"), answer.get("message")
    if not (
        isinstance(seq, int)
        and isinstance(at, int | float)
        and isinstance(actor, str)
        and isinstance(kind, str)
        and isinstance(args, dict)
        and isinstance(ok, bool)
        and isinstance(message, str)
    ):
        return None
    return Event(seq, float(at), actor, kind, args, ok, message)


def _json(data: bytes) -> dict[str, object]:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
