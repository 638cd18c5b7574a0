"""How one replica is moved to another version: a command, or an HTTP request.

Both take a :class:`Target` (which replica, where, to what version), fill their template's
placeholders (router/rollout/templates.py) and say how it went in an :class:`UpdateResult`;
neither raises for a failed update. An updater only *starts* the update (a restart returns
while the engine loads); the rollout then waits until the replica serves the new version.

The command runs without a shell (``asyncio.create_subprocess_exec`` on the words of the
command line, placeholders filled inside each word), so a version or replica name is always
one argument and can never be read as shell syntax. It runs in a session of its own, so that
on its timeout the whole process group is killed, not only the first process (a
``sh -c '...'`` would otherwise leave its children running and holding the output pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

import aiohttp
from yarl import URL

from router.config.schema import CommandUpdaterConfig, HttpUpdaterConfig, UpdaterConfig
from router.rollout.templates import fill, split_command

__all__ = [
    "OUTPUT_LIMIT",
    "CommandUpdater",
    "HttpUpdater",
    "Target",
    "UpdateResult",
    "Updater",
    "build_updater",
]

OUTPUT_LIMIT = 4096
"""Characters of a command's output (its tail) or an HTTP answer (its head) kept."""
_REAP_S = 5.0
"""After a kill, how long to wait for the process group's pipes to close."""


@dataclass(frozen=True, slots=True)
class Target:
    """One replica to update: the placeholders' values."""

    replica: str
    node: str
    url: str
    version: str

    def values(self) -> Mapping[str, str]:
        return {
            "replica": self.replica,
            "node": self.node,
            "url": self.url,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """How an update went."""

    ok: bool
    summary: str
    """``exit 0``, ``exit 1``, ``timed out after 5 s``, ``HTTP 202``, ``cannot run: ...``."""
    output: str = ""
    """The command's output (stdout and stderr, the tail) or the answer's body (the head)."""
    seconds: float = 0.0


class Updater(Protocol):
    """Starts the update of one replica."""

    def describe(self, target: Target) -> str:
        """What will be done, for the audit trail (the filled command or request)."""
        ...

    async def update(self, target: Target) -> UpdateResult: ...


class CommandUpdater:
    """Runs the command line of a :class:`CommandUpdaterConfig` per replica."""

    def __init__(self, config: CommandUpdaterConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self._words = split_command(config.run)
        self._clock = clock

    def argv(self, target: Target) -> list[str]:
        values = target.values()
        return [fill(word, values) for word in self._words]

    def describe(self, target: Target) -> str:
        return " ".join(self.argv(target))

    async def update(self, target: Target) -> UpdateResult:
        started = self._clock()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv(target),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return UpdateResult(False, f"cannot run: {exc}", seconds=self._clock() - started)
        reading = asyncio.ensure_future(process.communicate())
        done, _ = await asyncio.wait({reading}, timeout=self.config.timeout_s)
        if not done:
            _kill_group(process.pid)
            output = await _reaped(reading)
            summary = f"timed out after {self.config.timeout_s:g} s (killed)"
            return UpdateResult(False, summary, _tail(output), self._clock() - started)
        out, _ = reading.result()
        code = process.returncode
        return UpdateResult(code == 0, f"exit {code}", _tail(out), self._clock() - started)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended between the timeout and now
        os.killpg(pid, signal.SIGKILL)


async def _reaped(reading: asyncio.Future[tuple[bytes, bytes]]) -> bytes:
    """What the killed command wrote, once its pipes closed (or nothing, if they do not)."""
    try:
        out, _ = await asyncio.wait_for(reading, _REAP_S)
    except TimeoutError:
        return b""
    return out


def _tail(output: bytes | None) -> str:
    text = (output or b"").decode("utf-8", "replace")
    return text[-OUTPUT_LIMIT:]


class HttpUpdater:
    """Sends the request of an :class:`HttpUpdaterConfig` per replica."""

    def __init__(
        self,
        config: HttpUpdaterConfig,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.config = config
        self._session = session
        self._clock = clock

    def url(self, target: Target) -> str:
        # Every value but the replica's own URL is one path or query segment: encoded.
        values = {k: v if k == "url" else quote(v, safe="") for k, v in target.values().items()}
        return fill(self.config.url, values)

    def body(self, target: Target) -> str | None:
        if self.config.body is None:
            return None
        # Inside a JSON string: escaped as JSON escapes it (the quotes json.dumps adds cut off).
        return fill(self.config.body, target.values(), lambda v: json.dumps(v)[1:-1])

    def describe(self, target: Target) -> str:
        body = self.body(target)
        return f"{self.config.method} {self.url(target)}" + (f" {body}" if body else "")

    async def update(self, target: Target) -> UpdateResult:
        started = self._clock()
        session = self._session or aiohttp.ClientSession()
        body = self.body(target)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        try:
            async with session.request(
                self.config.method,
                URL(self.url(target), encoded=True),
                data=body,
                headers=headers,
                timeout=timeout,
            ) as answer:
                text = (await answer.content.read(OUTPUT_LIMIT)).decode("utf-8", "replace")
                ok = answer.status == self.config.expect_status
                summary = f"HTTP {answer.status}" + (
                    "" if ok else f", expected {self.config.expect_status}"
                )
                return UpdateResult(ok, summary, text, self._clock() - started)
        except TimeoutError:
            summary = f"timed out after {self.config.timeout_s:g} s"
            return UpdateResult(False, summary, seconds=self._clock() - started)
        except aiohttp.ClientError as exc:
            summary = f"request failed: {str(exc) or type(exc).__name__}"
            return UpdateResult(False, summary, seconds=self._clock() - started)
        finally:
            if self._session is None:
                await session.close()


def build_updater(config: UpdaterConfig) -> Updater:
    """The updater the configuration names (the loader made sure it names exactly one)."""
    if config.command is not None:
        return CommandUpdater(config.command)
    if config.http is not None:
        return HttpUpdater(config.http)
    raise ValueError("an updater needs a command or an http request")
