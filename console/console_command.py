"""``gpurouter console``: the live dashboard, with the router running in the same process
(``--config FLEET``), or on a router running elsewhere, through its admin API (``--attach
URL``, see :mod:`console.attach`); ``--broker URL`` watches the cluster's routers and nodes
through its MQTT broker, beside an attached router or alone, read-only (see
:mod:`console.cluster`)."""

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

if TYPE_CHECKING:
    from textual.app import App

    from console.app import ConsoleApp
    from console.attach.backend import RemoteBackend
    from console.cluster.watch import ClusterWatch
    from console.router_host import LocalRouter

PROG = "gpurouter console"


def add_arguments(p: argparse.ArgumentParser) -> None:
    # One of --config, --attach or --broker (checked in run: --broker may join --attach).
    source = p.add_mutually_exclusive_group()
    source.add_argument("--config", help="fleet YAML file: run the router in this process")
    source.add_argument(
        "--attach",
        metavar="URL",
        help="a running router's admin API (what `gpurouter ctl --admin` takes): watch it; "
        "steer it with the token in $GPUROUTER_ADMIN_TOKEN (without one: read-only)",
    )
    p.add_argument(
        "--broker",
        metavar="URL",
        help="the cluster's MQTT broker (mqtt://host:port): with --attach, the GPUs' telemetry "
        "from it and every router of the cluster (c); alone, that cluster view, read-only",
    )
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="with --broker alone: the cluster to watch (default: default); attached, the "
        "router's fleet names it",
    )
    p.add_argument(
        "--theme",
        help="dark, light or high-contrast (default: the fleet file's console.theme)",
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="watch only: every action that changes the router is refused",
    )
    p.add_argument(
        "--refresh",
        type=float,
        metavar="SECONDS",
        help="refresh interval (default: console.refresh_s, 1 s); +/- change it live",
    )
    p.add_argument(
        "--no-telemetry",
        action="store_true",
        help="start no MQTT broker or subscriber; utilization is the router's estimate",
    )
    add_listen_options(p)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: Textual and the HTTP stack are not needed to build the parser.
    from console.app import ConsoleApp
    from console.router_host import LocalRouter
    from router.config import load_fleet
    from router.http.server import ListenError

    try:
        if args.refresh is not None and args.refresh <= 0:
            raise GpuRouterError(f"--refresh must be > 0, got {args.refresh}")
        _check_sources(args)
        if args.attach is not None:
            return _attached(args, err)
        if args.broker is not None:
            return _watched(args)
        check_listen_options(args)
        fleet = load_fleet(args.config)
        host = LocalRouter(
            fleet,
            telemetry=not args.no_telemetry,
            listen=args.listen,
            admin_listen=admin_address(args, fleet),
        )
        # Built before the router starts: a bad key or theme is reported without side effects.
        app = ConsoleApp(
            host.backend(), theme=args.theme, read_only=args.read_only, refresh_s=args.refresh
        )
        asyncio.run(_run(app, host))
    except GpuRouterError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    except ListenError as exc:
        err.write(listen_failure(PROG, exc) + "\n")
        return 1
    except OSError as exc:
        err.write(f"{PROG}: cannot start the router: {exc}\n")
        return 1
    return 0


def _check_sources(args: argparse.Namespace) -> None:
    """Where the console's router is: in this process, elsewhere, or only on a broker."""
    if args.config is None and args.attach is None and args.broker is None:
        raise GpuRouterError("one of --config, --attach or --broker is required")
    if args.config is not None and args.broker is not None:
        raise GpuRouterError(
            "--broker: with --attach or alone (the router in this process hears the broker "
            "its fleet file names)"
        )
    if args.cluster is not None and (args.broker is None or args.attach is not None):
        raise GpuRouterError("--cluster: only with --broker alone (an attached router names it)")
    if args.config is None:
        hosting = {"--no-telemetry": args.no_telemetry, "--listen": args.listen}
        hosting["--admin-listen"] = args.admin_listen
        given = [flag for flag, value in hosting.items() if value]
        if given:
            raise GpuRouterError(
                f"{', '.join(given)}: only with --config (the router runs elsewhere)"
            )


def _watched(args: argparse.Namespace) -> int:
    """The cluster's routers and nodes through its broker alone: nothing to steer."""
    from console.cluster.app import ClusterApp
    from console.cluster.watch import ClusterWatch
    from router.config.schema import FleetConfig

    try:
        watch = ClusterWatch(args.broker, FleetConfig(nodes=(), cluster=args.cluster or "default"))
    except ValueError as exc:  # a cluster name that cannot be a topic level
        raise GpuRouterError(str(exc)) from None
    app = ClusterApp(watch, refresh_s=args.refresh or 1.0, theme=args.theme)
    asyncio.run(_run_watched(app, watch))
    return 0


async def _run_watched(app: App[None], watch: ClusterWatch) -> None:
    await watch.start()
    try:
        await app.run_async()
    finally:
        await watch.stop()


def _attached(args: argparse.Namespace, err: TextIO) -> int:
    """The console on a router elsewhere; a wrong URL or token exits as ``ctl`` does."""
    from console.ctl import CtlError

    try:
        asyncio.run(_run_attached(args))
    except CtlError as exc:
        err.write(f"{PROG}: error: {exc}\n")
        return exc.exit_code
    return 0


async def _run_attached(args: argparse.Namespace) -> None:
    from console.app import ConsoleApp
    from console.attach.backend import attach
    from console.ctl.client import actor_name, token_from_environment

    backend = await attach(
        args.attach, token=token_from_environment(), actor=actor_name("attached-console")
    )
    try:
        if args.broker is not None:
            from console.cluster.watch import ClusterWatch

            backend.cluster = ClusterWatch(args.broker, backend.fleet)
        app = ConsoleApp(
            backend, theme=args.theme, read_only=args.read_only, refresh_s=args.refresh
        )
    except BaseException:
        await backend.stop()
        raise
    await _run_remote(app, backend)


async def _run_remote(app: ConsoleApp, backend: RemoteBackend) -> None:
    """The router's state is polled at the console's refresh interval, as it changes."""
    backend.interval = lambda: app.refresh_s
    await backend.start()
    try:
        await app.run_async()
    finally:
        await backend.stop()


async def _run(app: ConsoleApp, host: LocalRouter) -> None:
    """Router and console on one loop: the router starts first and stops last."""
    await host.start()
    try:
        await app.run_async()
    finally:
        await host.stop()
