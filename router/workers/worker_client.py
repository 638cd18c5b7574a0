"""HTTP to the workers' private APIs over their Unix sockets (private_api.py), for the
service's admin API in the supervisor, for the worker that answers the service's /metrics and
for the workers that relay a rollout to the one that runs it (:data:`ROLLOUT_WORKER`).

A worker's socket lives at ``<dir>/worker-<index>.sock`` for every run of that worker, so a
restarted worker is reached at the same address; a worker that does not answer (dead,
restarting, stopped) is an error the caller reports, never a hang: every call has a timeout.
The supervisor's own socket (supervisor_api.py) is ``<dir>/service.sock``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp

__all__ = [
    "ROLLOUT_WORKER",
    "UNREACHABLE",
    "Answer",
    "WorkerClient",
    "service_socket_path",
    "socket_path",
]

TIMEOUT_S = 5.0
UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError)
"""What a call to a worker that does not answer raises."""
ROLLOUT_WORKER = 0
"""The worker that runs the service's rollouts and traffic splits (docs/decisions/0007)."""


def socket_path(directory: Path, index: int) -> Path:
    return directory / f"worker-{index}.sock"


def service_socket_path(directory: Path) -> Path:
    """The supervisor's own socket, where workers give it commands and ask its state."""
    return directory / "service.sock"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    content_type: str
    body: bytes


class WorkerClient:
    """One connection pool per worker socket."""

    def __init__(self, directory: Path, workers: int, timeout_s: float = TIMEOUT_S) -> None:
        self.directory = directory
        self.workers = workers
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._sessions: dict[int, aiohttp.ClientSession] = {}

    def session(self, index: int) -> aiohttp.ClientSession:
        session = self._sessions.get(index)
        if session is None or session.closed:
            connector = aiohttp.UnixConnector(path=str(socket_path(self.directory, index)))
            session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
            self._sessions[index] = session
        return session

    async def request(
        self,
        index: int,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Answer:
        """One request to worker ``index``; one of ``UNREACHABLE`` when it does not answer
        (within ``timeout_s``, by default the client's)."""
        timeout = self.timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        async with self.session(index).request(
            method, f"http://worker{path}", data=body, headers=headers, timeout=timeout
        ) as response:
            data = await response.read()
            return Answer(response.status, response.headers.get("content-type", ""), data)

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
