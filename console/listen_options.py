"""``--listen`` and ``--admin-listen``, shared by the commands that run a router (serve, console,
demo): the options, the port-0 rule, and what a listener that cannot bind says."""

from __future__ import annotations

import argparse
import errno
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.config.schema import FleetConfig

__all__ = ["add_listen_options", "admin_address", "check_listen_options", "listen_failure"]

_FLAGS = {"server.listen": "--listen", "server.admin_listen": "--admin-listen"}


def add_listen_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="front door address (default: the fleet file's server.listen); port 0 takes a "
        "free port, and then the admin API does too unless --admin-listen is given",
    )
    p.add_argument(
        "--admin-listen",
        metavar="HOST:PORT",
        help="admin API address (default: the fleet file's server.admin_listen); "
        "not loopback needs a token",
    )


def check_listen_options(args: argparse.Namespace) -> None:
    """GpuRouterError for an address that is not HOST:PORT, before anything starts."""
    from router.errors import GpuRouterError
    from router.http.server import split_host_port

    for flag, option in (("--listen", args.listen), ("--admin-listen", args.admin_listen)):
        try:
            if option is not None:
                split_host_port(option)
        except ValueError as exc:
            raise GpuRouterError(f"{flag}: {exc}") from None


def admin_address(args: argparse.Namespace, fleet: FleetConfig) -> str | None:
    """The admin API's address: ``--admin-listen``; else, when ``--listen`` asks for any free
    port, any free port on the fleet file's admin host (a second router beside a first then
    starts with no flag more); else the fleet file's (None)."""
    from router.http.server import split_host_port

    asked: str | None = args.admin_listen
    if asked is not None or args.listen is None:
        return asked
    if split_host_port(args.listen)[1] != 0:
        return None
    host, _ = split_host_port(fleet.server.admin_listen)
    return f"[{host}]:0" if ":" in host else f"{host}:0"


def listen_failure(prog: str, exc: OSError) -> str:
    """One line for a listener that could not bind: which one, and the flag that moves it."""
    from router.http.server import ListenError

    if not isinstance(exc, ListenError):
        return f"{prog}: cannot listen: {exc}"
    flag = _FLAGS.get(exc.setting, exc.setting)
    taken = " (is another gpurouter running?)" if exc.errno == errno.EADDRINUSE else ""
    return (
        f"{prog}: {exc}{taken}; move it with {flag} HOST:PORT or {exc.setting} in the "
        "fleet file (port 0 takes a free one)"
    )
