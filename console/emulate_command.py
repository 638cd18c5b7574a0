"""``gpurouter emulate``: serve a fleet file's replicas as emulated vLLM servers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import math
import signal
from typing import TYPE_CHECKING, TextIO

from router.errors import GpuRouterError

if TYPE_CHECKING:
    from router.emulator import EmulatedFleet

_STOP_TIMEOUT_S = 4.0
"""Shutting down must end within 5 s of the signal; this leaves room to exit."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="fleet YAML file")
    p.add_argument(
        "--replica",
        action="append",
        metavar="ID",
        help="emulate only this replica (repeatable; default: all of them)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="run this many times faster than life (default 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of lengths and failures (0)")
    p.add_argument(
        "--control-listen",
        metavar="HOST:PORT",
        help="serve the fault-injection API here (loopback only), e.g. 127.0.0.1:9100",
    )
    p.add_argument(
        "--load-s",
        type=float,
        default=5.0,
        metavar="S",
        help="emulated seconds a version switch takes to load its model (5)",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: aiohttp and the engine are not needed to build the parser.
    from router.config import load_fleet
    from router.emulator import EmulatedFleet

    try:
        control = _control_address(args.control_listen) if args.control_listen else None
        if args.time_scale <= 0:
            raise GpuRouterError(f"--time-scale must be > 0, got {args.time_scale}")
        if not (math.isfinite(args.load_s) and args.load_s >= 0):
            raise GpuRouterError(f"--load-s must be a number >= 0, got {args.load_s}")
        fleet = EmulatedFleet(
            load_fleet(args.config),
            replicas=args.replica,
            time_scale=args.time_scale,
            seed=args.seed,
            load_s=args.load_s,
        )
        asyncio.run(_serve(fleet, control, out))
    except GpuRouterError as exc:
        err.write(f"gpurouter emulate: {exc}\n")
        return 2
    except OSError as exc:
        err.write(f"gpurouter emulate: cannot listen: {exc}\n")
        return 1
    return 0


def _control_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        number = int(port)
    except ValueError:
        loopback, number = False, -1
    if not sep or not loopback or not 0 <= number <= 65535:
        raise GpuRouterError(f"--control-listen must be a loopback HOST:PORT, got {text!r}")
    return ("127.0.0.1" if host == "localhost" else host), number


async def _serve(fleet: EmulatedFleet, control: tuple[str, int] | None, out: TextIO) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await fleet.start()
        for replica in fleet.replicas.values():
            c = replica.config
            gpus = f"{c.gpu_model} x{len(c.gpus)}"
            out.write(f"emulating {c.id} ({gpus}, {c.model}) on {replica.url}\n")
        if control is not None:
            port = await fleet.start_control(*control)
            host = f"[{control[0]}]" if ":" in control[0] else control[0]
            out.write(f"control on http://{host}:{port}\n")
        out.flush()
        await stop.wait()
    finally:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fleet.stop(), _STOP_TIMEOUT_S)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
