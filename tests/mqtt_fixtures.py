"""Real MQTT brokers on loopback for the telemetry tests: Mosquitto and the embedded amqtt.

Both have the same shape (``start() -> url``, ``stop()``, ``kill()``, ``port``), so a test
parametrised over :data:`BROKERS` runs unchanged against either. A broker restarted after
``kill`` comes back on the same port, as a real one restarted by systemd would.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import pytest

from router.telemetry.embedded_broker import EmbeddedBroker

MOSQUITTO = "/usr/sbin/mosquitto"
BROKERS = ("embedded", "mosquitto")
WAIT_S = 15.0
"""Upper bound of every wait for a condition; conditions are polled, never slept on."""


class Broker(Protocol):
    port: int

    @property
    def url(self) -> str: ...

    async def start(self) -> str: ...

    async def stop(self) -> None: ...

    async def kill(self) -> None: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mosquitto_binary() -> str:
    """The Mosquitto binary; skips the test where it is missing, except on CI (CI=true),
    where a missing broker must fail the run rather than hide half the tests."""
    found = MOSQUITTO if os.access(MOSQUITTO, os.X_OK) else shutil.which("mosquitto")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("mosquitto is not installed, and CI=true requires it")
        pytest.skip("mosquitto is not installed")
    return found


class Mosquitto:
    """A Mosquitto on 127.0.0.1 with a generated config: anonymous, no persistence, unless
    a password file or ``settings`` (lines that replace ``persistence false``) say else."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        password_file: Path | None = None,
        settings: str = "persistence false\n",
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        auth = (
            "allow_anonymous true\n"
            if password_file is None
            else f"allow_anonymous false\npassword_file {password_file}\n"
        )
        # Started as root, Mosquitto drops to the 'mosquitto' user, which cannot read the
        # test's private directory; staying the user who runs the tests avoids that.
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\n{auth}{settings}log_type error\n"
            f"user {getpass.getuser()}\n"
        )
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    async def start(self) -> str:
        self._proc = await asyncio.create_subprocess_exec(
            self.binary,
            "-c",
            str(self.config),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await until(self._accepts, what=f"mosquitto listening on {self.port}")
        return self.url

    async def _accepts(self) -> bool:
        if self._proc is not None and self._proc.returncode is not None:
            raise RuntimeError(f"mosquitto exited with {self._proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()


async def until(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    what: str,
    timeout_s: float = WAIT_S,
    poll_s: float = 0.02,
) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(poll_s)


def make_broker(kind: str, workdir: Path) -> Broker:
    if kind == "mosquitto":
        return Mosquitto(mosquitto_binary(), workdir)
    return EmbeddedBroker()
