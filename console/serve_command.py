"""``gpurouter serve``: the router headless, its front door and admin API on HTTP."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, TextIO

from router.errors import GpuRouterError

if TYPE_CHECKING:
    from router.http.server import RouterServer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="fleet YAML file")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="front door address (default: the fleet file's server.listen; port 0: any)",
    )
    p.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin API address (default: server.admin_listen); not loopback needs a token",
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: uvicorn, aiohttp and prometheus-client are not needed to build the parser.
    from router.config import load_fleet
    from router.http.server import RouterServer, split_host_port

    try:
        for option in (args.listen, args.admin_listen):
            if option is not None:
                split_host_port(option)
        server = RouterServer(
            load_fleet(args.config), listen=args.listen, admin_listen=args.admin_listen
        )
    except (GpuRouterError, ValueError) as exc:
        err.write(f"gpurouter serve: {exc}\n")
        return 2
    try:
        _run_loop(_serve(server, out))
    except OSError as exc:
        err.write(f"gpurouter serve: cannot listen: {exc}\n")
        return 1
    return 0


def _run_loop(main: object) -> None:
    try:
        import uvloop
    except ImportError:  # not on Windows: the default loop serves too, a little slower
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]


async def _serve(server: RouterServer, out: TextIO) -> None:
    await server.start()
    out.write(f"front door on {server.front_url}\nadmin API on {server.admin_url}\n")
    out.flush()
    await server.serve_forever()
    out.write("stopped\n")
    out.flush()
