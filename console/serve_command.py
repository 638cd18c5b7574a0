"""``gpurouter serve``: the router headless: its front door and admin API on HTTP, and over
MQTT the GPUs' telemetry and the operators' commands (router/telemetry/feeds.py)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, TextIO

from console.listen_options import (
    add_listen_options,
    admin_address,
    check_listen_options,
    listen_failure,
)
from router.errors import GpuRouterError
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


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: uvicorn, aiohttp and prometheus-client are not needed to build the parser.
    from router.config import load_fleet
    from router.http.admin import admin_token
    from router.http.server import RouterServer
    from router.telemetry.control_auth import resolve_secret
    from router.telemetry.feeds import RouterFeeds

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
        _run_loop(_serve(server, feeds, out))
    except OSError as exc:
        err.write(listen_failure(PROG, exc) + "\n")
        return 1
    return 0


def _run_loop(main: object) -> None:
    try:
        import uvloop
    except ImportError:  # not on Windows: the default loop serves too, a little slower
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]


async def _serve(server: RouterServer, feeds: RouterFeeds | None, out: TextIO) -> None:
    async def started() -> None:
        out.write(f"front door on {server.front_url}\nadmin API on {server.admin_url}\n")
        if feeds is None:
            out.write("telemetry off (--no-telemetry)\n")
        else:
            await feeds.start()
            out.write("".join(f"{note}\n" for note in feeds.notes))
            # A command given here is published as desired state: every router applies it.
            server.admin.apply = feeds.apply
        out.flush()

    try:
        await server.serve_forever(started)
    finally:
        if feeds is not None:
            await feeds.stop()
    out.write("stopped\n")
    out.flush()
