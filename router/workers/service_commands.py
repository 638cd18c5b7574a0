"""How a control command given to a ``gpurouter serve --workers N`` reaches its workers, in the
supervisor: the operator's, from the service's admin API (service_admin.py), and a rollout's,
from the worker that runs it (supervisor_api.py).

- **With a control link** a command goes to one worker, which publishes it as the cluster's
  desired state: every worker applies it from the broker, like every other router, and a
  worker that starts later gets it back from the retained messages (and from the state file
  the service's workers share).
- **Without one** (``--no-telemetry``) it goes to every worker that serves, each applying it
  to its own core, and the supervisor keeps it as the service's desired state: the last
  command applied on each slot (router/telemetry/control_messages.py's ``slot_of``, as the
  broker keeps them). A worker that (re)starts asks for that state before it opens its front
  door and applies it (:meth:`ServiceCommands.join`); from that moment it is given every
  later command too (its private socket holds them until it serves), so none falls between
  what it was sent and what it asked for. One command is given at a time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from router.control import parse_command
from router.errors import ControlError
from router.telemetry.control_messages import slot_of
from router.workers.load_table import LoadTable
from router.workers.worker_client import UNREACHABLE, Answer, WorkerClient

__all__ = ["Given", "ServiceCommands"]


@dataclass(frozen=True, slots=True)
class Given:
    """A command given to the workers: each asked worker's answer (None: it did not answer)."""

    answers: dict[int, Answer | None]

    def first(self) -> tuple[int, Answer] | None:
        """The lowest-numbered worker that answered, and its answer."""
        return next(((i, a) for i, a in sorted(self.answers.items()) if a is not None), None)

    def statuses(self) -> dict[str, int | None]:
        return {str(i): (a.status if a else None) for i, a in sorted(self.answers.items())}


@dataclass(frozen=True, slots=True)
class _Kept:
    seq: int
    command: dict[str, Any]
    actor: str


class ServiceCommands:
    def __init__(self, client: WorkerClient, table: LoadTable, *, broadcast: bool) -> None:
        """``broadcast``: no control link; give every command to every worker and keep the
        service's desired state."""
        self.client = client
        self.table = table
        self.broadcast = broadcast
        self._desired: dict[str, _Kept] = {}
        self._joining: set[int] = set()
        self._seq = 0
        self._lock = asyncio.Lock()

    def serving(self) -> list[int]:
        """The workers that serve now (their pid is in the table), and, without a control
        link, those that have asked for the desired state and will serve in a moment."""
        pids = {i for i in range(self.table.workers) if self.table.pid(i)}
        return sorted(pids | self._joining)

    async def give(self, body: bytes, headers: dict[str, str]) -> Given:
        """Give ``body`` (a command's JSON) to the workers, as ``POST /admin/commands``."""
        if not self.broadcast:
            indexes = self.serving()[:1]
            return Given(dict(zip(indexes, await self._ask(indexes, body, headers), strict=True)))
        async with self._lock:
            indexes = self.serving()
            answers = dict(zip(indexes, await self._ask(indexes, body, headers), strict=True))
            if any(a is not None and a.status == 200 for a in answers.values()):
                self._keep(body, headers.get("x-actor") or "admin")
            return Given(answers)

    async def join(self, index: int) -> list[dict[str, Any]]:
        """Worker ``index`` starts: the service's desired state for it to apply, oldest
        first (``{"command": {...}, "actor": ...}``); every command given from now on goes
        to it too."""
        async with self._lock:
            self._joining.add(index)
            kept = sorted(self._desired.values(), key=lambda k: k.seq)
            return [{"command": k.command, "actor": k.actor} for k in kept]

    def gone(self, index: int) -> None:
        """Worker ``index`` exited: it is given nothing more until it joins again."""
        self._joining.discard(index)

    async def _ask(
        self, indexes: list[int], body: bytes, headers: dict[str, str]
    ) -> list[Answer | None]:
        async def one(index: int) -> Answer | None:
            try:
                return await self.client.request(
                    index, "POST", "/admin/commands", body=body, headers=headers
                )
            except UNREACHABLE:
                return None

        return list(await asyncio.gather(*(one(i) for i in indexes)))

    def _keep(self, body: bytes, actor: str) -> None:
        try:
            data = orjson.loads(body)
            slot = slot_of(parse_command(data))
        except (orjson.JSONDecodeError, ControlError, ValueError, TypeError, AttributeError):
            return  # a worker applied what does not parse here: nothing to keep
        self._seq += 1
        self._desired[slot] = _Kept(self._seq, dict(data), actor)
