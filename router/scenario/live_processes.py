"""The emulated fleet and the load generator of a live run, each in a process of its own.

A live run judges the router. When all three shared one event loop, the emulator (every
engine step, every token's chunk) and the load generator (every chunk read back) took turns
with the router, so a check measured their work as the router's latency, and one busy core
bounded the whole run. Apart, the router's loop carries only the router, the operating
system spreads the three over the machine's cores, and each reports on itself: the load
generator how late it sent, the emulator how far its engines' clocks fell behind.

Each child ignores Ctrl-C (the parent reports an interrupt and stops them) and talks to the
parent over a pipe; faults go to the emulator's own control API (router.emulator.control).
The processes start with ``spawn``: forking a process that runs an event loop is unsafe.
Waiting on a pipe uses the event loop's reader, so an interrupted run does not wait on
a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing as mp
import signal
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import aiohttp

from router.config.schema import FleetConfig
from router.loadgen import LoadGenerator, LoadReport, Shot

__all__ = ["EmulatorProcess", "LoadProcess", "pointed_at"]

_START_TIMEOUT_S = 60.0
"""A child that has not said it is ready by then is not coming (importing takes a second)."""
_STOP_TIMEOUT_S = 10.0


def pointed_at(fleet: FleetConfig, urls: Mapping[str, str]) -> FleetConfig:
    """The fleet with each replica's endpoint replaced by where the emulator serves it."""
    nodes = tuple(
        dataclasses.replace(
            node,
            replicas=tuple(
                dataclasses.replace(r, endpoint=urls.get(r.id, r.endpoint)) for r in node.replicas
            ),
        )
        for node in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


async def _recv(conn: Connection, timeout: float | None) -> Any:
    """The next message from a child; OSError if it died or said nothing within ``timeout``."""
    loop = asyncio.get_running_loop()
    if not conn.poll():
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), readable)
        try:
            await asyncio.wait_for(ready, timeout)
        except TimeoutError:
            raise OSError(
                f"a child process of the live run said nothing in {timeout:g} s"
            ) from None
        finally:
            loop.remove_reader(conn.fileno())
    try:
        return conn.recv()
    except EOFError:
        raise OSError("a child process of the live run ended unexpectedly") from None


def _quiet_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _Child:
    """One child process and its end of the pipe."""

    def __init__(self, target: Any, args: tuple[Any, ...]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process: BaseProcess = ctx.Process(target=target, args=(*args, child), daemon=True)
        self.process.start()
        child.close()

    async def recv(self, timeout: float | None = _START_TIMEOUT_S) -> Any:
        return await _recv(self.conn, timeout)

    def send(self, message: Any) -> None:
        with contextlib.suppress(OSError):  # a child that is gone needs no message
            self.conn.send(message)

    async def join(self, *, wait: bool = True) -> None:
        """Until the process ends; it is terminated if it has not within the stop timeout,
        or at once without ``wait`` (a run cut short: nothing it has is wanted)."""
        loop = asyncio.get_running_loop()
        process = self.process
        deadline = loop.time() + (_STOP_TIMEOUT_S if wait else 0.0)
        while process.is_alive() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if process.is_alive():
            process.terminate()
            await asyncio.to_thread(process.join, _STOP_TIMEOUT_S)
        self.conn.close()


# ---- the emulated fleet ----------------------------------------------------------------------


class EmulatorProcess:
    """The fleet file's replicas served by the emulator in a child process."""

    def __init__(self, fleet_file: Path, *, time_scale: float, seed: int) -> None:
        self._args = (str(fleet_file), time_scale, seed)
        self._child: _Child | None = None
        self._control = ""
        self._session: aiohttp.ClientSession | None = None
        self.urls: dict[str, str] = {}

    async def start(self) -> dict[str, str]:
        """Start serving; each replica's URL, by id. OSError if it cannot listen."""
        self._child = _Child(_emulator_main, self._args)
        answer = await self._child.recv()
        if "error" in answer:
            raise OSError(answer["error"])
        self.urls = dict(answer["urls"])
        self._control = f"http://127.0.0.1:{answer['control']}"
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0))
        return self.urls

    @property
    def control_url(self) -> str:
        """The emulator's control API (faults, version switches)."""
        return self._control

    def measure(self) -> None:
        """Start the engines' clock count now."""
        assert self._child is not None
        self._child.send("measure")

    async def clock_shares(self) -> dict[str, float]:
        """Per replica, engine time over wall time x time scale since ``measure``."""
        assert self._child is not None
        self._child.send("clock")
        shares: dict[str, float] = await self._child.recv()
        return shares

    async def fault(self, replica: str, body: dict[str, Any]) -> tuple[bool, str]:
        """Set a fault through the emulator's control API; whether it was set, and what it
        answered."""
        assert self._session is not None
        url = f"{self._control}/faults/{replica}"
        try:
            async with self._session.post(url, json=body) as resp:
                answer = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return False, f"{replica}: the emulator's control API did not answer: {exc}"
        if resp.status != 200:
            return False, f"{replica}: {answer['error']['message']}"
        return True, f"{replica}: {answer['faults']}"

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        child, self._child = self._child, None
        if child is not None:
            child.send("stop")
            await child.join()


class _ClientGone(logging.Filter):
    """Drops aiohttp's report of a handler whose connection was reset under it: the ``kill``
    fault resets them on purpose, and each would print a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ConnectionResetError)


def _emulator_main(fleet_file: str, time_scale: float, seed: int, conn: Connection) -> None:
    _quiet_interrupts()
    logging.getLogger("aiohttp.server").addFilter(_ClientGone())
    asyncio.run(_emulate(fleet_file, time_scale, seed, conn))


async def _emulate(fleet_file: str, time_scale: float, seed: int, conn: Connection) -> None:
    from router.config import load_fleet
    from router.emulator import EmulatedFleet

    fleet = load_fleet(fleet_file)
    # Served on loopback whatever hosts the fleet file names (the ports are the OS's).
    loopback = pointed_at(fleet, {r.id: "http://127.0.0.1:1" for r in fleet.replicas})
    emulated = EmulatedFleet(
        loopback, time_scale=time_scale, seed=seed, ports={r.id: 0 for r in fleet.replicas}
    )
    try:
        await emulated.start()
        control = await emulated.start_control()
    except OSError as exc:
        conn.send({"error": f"the emulator cannot listen: {exc}"})
        await emulated.stop()
        return
    loop = asyncio.get_running_loop()
    conn.send({"urls": {rid: r.url for rid, r in emulated.replicas.items()}, "control": control})
    wall0, engine0 = loop.time(), {rid: r.driver.now() for rid, r in emulated.replicas.items()}
    try:
        while (message := await _recv(conn, None)) != "stop":
            if message == "measure":
                wall0 = loop.time()
                engine0 = {rid: r.driver.now() for rid, r in emulated.replicas.items()}
            elif message == "clock":
                wall = (loop.time() - wall0) * time_scale
                conn.send(
                    {
                        rid: (r.driver.now() - engine0[rid]) / wall if wall > 0 else 1.0
                        for rid, r in emulated.replicas.items()
                    }
                )
    except OSError:
        pass  # the parent is gone: stop serving
    finally:
        await emulated.stop()


# ---- the load generator ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _LoadPlan:
    url: str
    model: str
    shots: Sequence[Shot]
    max_duration_s: float
    drain_s: float
    time_scale: float


class LoadProcess:
    """router.loadgen's generator, sending a run's shots from a child process."""

    def __init__(
        self,
        url: str,
        model: str,
        shots: Sequence[Shot],
        *,
        max_duration_s: float,
        drain_s: float,
        time_scale: float,
    ) -> None:
        self._plan = _LoadPlan(url, model, list(shots), max_duration_s, drain_s, time_scale)
        self._child: _Child | None = None
        self._reported = False

    async def start(self) -> None:
        """Start the process and wait until it is ready to send."""
        self._child = _Child(_load_main, (self._plan,))
        await self._child.recv()

    def go(self, start_at: float) -> None:
        """Send the schedule with its time 0 at ``start_at`` on the monotonic clock, which
        every process of this machine reads alike."""
        assert self._child is not None
        self._child.send(start_at)

    async def drained(self) -> None:
        """Until the drain has ended; what is still running is cut off once ``cut_off`` is
        called, so that the run's records close before the cut-offs reach the router."""
        assert self._child is not None
        await self._child.recv(None)

    def cut_off(self) -> None:
        assert self._child is not None
        self._child.send("cut off")

    async def report(self) -> LoadReport:
        assert self._child is not None
        report: LoadReport = await self._child.recv()
        self._reported = True
        return report

    async def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            # Before its report the generator is still sending: an interrupted run ends it.
            await child.join(wait=self._reported)


def _load_main(plan: _LoadPlan, conn: Connection) -> None:
    _quiet_interrupts()
    with contextlib.suppress(OSError):  # the parent is gone: nothing to report to
        asyncio.run(_load(plan, conn))


async def _load(plan: _LoadPlan, conn: Connection) -> None:
    # Streamed, so that the first byte is the first token (TTFT), as the simulator counts it.
    generator = LoadGenerator(plan.url, plan.model, max_in_flight=4096, stream=True)
    conn.send("ready")
    start_at = await _recv(conn, None)

    async def drained() -> None:
        conn.send("drained")
        await _recv(conn, None)  # the parent has closed its records

    report = await generator.run(
        plan.shots,
        max_requests=len(plan.shots),
        max_duration_s=plan.max_duration_s,
        drain_s=plan.drain_s,
        time_scale=plan.time_scale,
        on_drained=drained,
        start_at=start_at,
    )
    conn.send(report)
