"""``gpurouter serve``: the router headless: its front door and admin API on HTTP, and over
MQTT the GPUs' telemetry and the operators' commands (router/telemetry/feeds.py)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, TextIO

from console.listen_options import (
    add_listen_options,
    admin_address,
    check_listen_options,
    listen_failure,
)
from router.errors import GpuRouterError
from router.event_loop import run_loop
from router.telemetry.status import DISABLED

if TYPE_CHECKING:
    from router.http.server import RouterServer
    from router.telemetry.feeds import RouterFeeds

PROG = "gpurouter serve"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="fleet YAML file")
    add_listen_options(p)
    p.add_argument(
        "--no-telemetry",
        action="store_true",
        help="no MQTT: neither GPU telemetry nor the control link (route on own accounting)",
    )
    p.add_argument(
        "--workers",
        type=_workers,
        default=None,
        metavar="N",
        help="router processes sharing the listening sockets and each other's load, under "
        "one supervisor (default: one per core this process may run on; 1: one process, "
        "no supervisor)",
    )


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def default_workers() -> int:
    """One worker per core this process may run on (its CPU affinity, where the system
    tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: uvicorn, aiohttp and prometheus-client are not needed to build the parser.
    from router.config import load_fleet
    from router.http.admin import admin_token
    from router.http.server import RouterServer
    from router.telemetry.control_auth import resolve_secret
    from router.telemetry.feeds import RouterFeeds

    workers = args.workers if args.workers is not None else default_workers()
    if workers > 1:
        return _run_workers(args, workers, out, err)
    feeds: RouterFeeds | None = None
    try:
        check_listen_options(args)
        fleet = load_fleet(args.config)
        server = RouterServer(
            fleet,
            listen=args.listen,
            admin_listen=admin_address(args, fleet),
            # Read first: an unset variable is its own error, whatever the address.
            admin_token=admin_token(fleet),
            telemetry=lambda: feeds.status() if feeds is not None else DISABLED,
        )
        if not args.no_telemetry:
            resolve_secret(fleet.control)  # an unset or short secret is its own error
            feeds = RouterFeeds(fleet, server.control)
    except (GpuRouterError, ValueError) as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    try:
        run_loop(_serve(server, feeds, out))
    except OSError as exc:
        err.write(listen_failure(PROG, exc) + "\n")
        return 1
    return 0


async def _serve(server: RouterServer, feeds: RouterFeeds | None, out: TextIO) -> None:
    async def started() -> None:
        out.write(f"front door on {server.front_url}\nadmin API on {server.admin_url}\n")
        if feeds is None:
            out.write("telemetry off (--no-telemetry)\n")
        else:
            await feeds.start()
            out.write("".join(f"{note}\n" for note in feeds.notes))
            # A command given here, and a rollout's, is published as desired state: every
            # router applies it.
            server.route_commands(feeds.apply)
        out.flush()

    try:
        await server.serve_forever(started)
    finally:
        if feeds is not None:
            await feeds.stop()
    out.write("stopped\n")
    out.flush()


def _run_workers(args: argparse.Namespace, workers: int, out: TextIO, err: TextIO) -> int:
    """``--workers N`` (N > 1): the fleet file checked once here, then the supervisor."""
    from router.config import load_fleet
    from router.http.admin import admin_token
    from router.http.server import RouterServer
    from router.telemetry.control_auth import resolve_secret
    from router.workers.supervisor import Supervisor, WorkerFailedError

    try:
        check_listen_options(args)
        fleet = load_fleet(args.config)
        token = admin_token(fleet)
        # The same checks a single router makes of its admin address and control secret.
        RouterServer.check_admin_address(fleet, admin_address(args, fleet), token)
        if not args.no_telemetry:
            resolve_secret(fleet.control)
        supervisor = Supervisor(
            fleet,
            args.config,
            workers,
            listen=args.listen or fleet.server.listen,
            admin_listen=admin_address(args, fleet) or fleet.server.admin_listen,
            admin_token=token,
            telemetry=not args.no_telemetry,
        )
    except (GpuRouterError, ValueError) as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2

    def started() -> None:
        out.write(f"front door on {supervisor.front_url}\nadmin API on {supervisor.admin_url}\n")
        out.write("".join(f"{note}\n" for note in supervisor.notes))
        out.flush()

    try:
        run_loop(supervisor.run(started))
    except OSError as exc:
        err.write(listen_failure(PROG, exc) + "\n")
        return 1
    except WorkerFailedError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 1
    out.write("stopped\n")
    out.flush()
    return 0
