"""One worker process of ``gpurouter serve --workers N``: a whole router (router/http/server.py)
on the front-door socket its supervisor bound and handed down, counting its siblings' load
from the shared load table, with its admin API private on a Unix socket.

Started by the supervisor (supervisor.py) as ``python -m router.workers.worker`` with the
inherited descriptors' numbers on its command line. Before it opens its front door it applies
the service's desired state: with a control link, the state file the service's workers share
and then the broker's retained messages; without one, what the supervisor keeps
(supervisor_client.py). So a worker restarted in the middle of a rollout holds its drains and
its split from its first request. It writes its pid into its table row once it serves (what
the supervisor waits for), and drains on SIGTERM as ``gpurouter serve`` does.

Worker 0 runs the service's rollouts and splits (docs/decisions/0007): their drains, undrains,
preemptions and splits are published over the control link like an operator's command, or
given to the supervisor, which gives them to every worker.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.event_loop import run_loop
from router.http.server import RouterServer
from router.telemetry.status import DISABLED
from router.workers.load_table import LoadTable
from router.workers.private_api import PrivateApi
from router.workers.service_metrics import ServiceMetrics
from router.workers.shared_load import SharedLoad
from router.workers.supervisor_client import SupervisorClient
from router.workers.worker_client import WorkerClient, socket_path

if TYPE_CHECKING:
    from router.telemetry.feeds import RouterFeeds

__all__ = ["main", "worker_argv"]

log = logging.getLogger("gpurouter.workers")

ORPHAN_CHECK_S = 1.0
"""How often a worker checks that its supervisor still runs."""


def worker_argv(
    config: Path, index: int, workers: int, listen_fd: int, table_fd: int, directory: Path
) -> list[str]:
    """The command line that starts worker ``index``."""
    return [
        sys.executable, "-m", "router.workers.worker", "--config", str(config),
        "--index", str(index), "--workers", str(workers), "--listen-fd", str(listen_fd),
        "--table-fd", str(table_fd), "--dir", str(directory),
    ]  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="router.workers.worker")
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--listen-fd", type=int, required=True)
    p.add_argument("--table-fd", type=int, required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--router-id", help="the service's router id (this worker's: ID-wINDEX)")
    p.add_argument("--broker", help="the supervisor's embedded broker, instead of the fleet's")
    p.add_argument("--no-telemetry", action="store_true")
    return p


def _feeds(args: argparse.Namespace, fleet: FleetConfig, server: RouterServer) -> RouterFeeds:
    """The worker's telemetry and control link, as one router of the cluster whose siblings'
    load reports are not counted again (the load table already counts their requests)."""
    from router.telemetry.feeds import RouterFeeds

    if args.broker is not None:
        broker = dataclasses.replace(fleet.broker, url=args.broker)
        fleet = dataclasses.replace(fleet, broker=broker)
    own = f"{args.router_id}-w{args.index}"
    server.core.peers.router = own
    server.core.peers.siblings = frozenset(
        f"{args.router_id}-w{i}" for i in range(args.workers) if i != args.index
    )
    return RouterFeeds(fleet, server.control, router_id=own)


def _private_socket(path: Path) -> socket.socket:
    """The worker's private listener; a previous run's socket file is replaced."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    return sock


async def _serve(
    server: RouterServer,
    table: LoadTable,
    index: int,
    client: WorkerClient,
    feeds: RouterFeeds | None,
    supervisor: SupervisorClient,
) -> None:
    async def started() -> None:
        table.set_pid(index, os.getpid())  # the supervisor's sign that this worker serves

    orphaned = asyncio.create_task(_stop_when_orphaned(os.getppid()))
    try:
        # The service's desired state first (a drain a rollout holds, its split), then the
        # front door: no request is routed on the fleet file's settings by mistake.
        if feeds is not None:
            await feeds.start()
            for note in feeds.notes:
                log.warning("%s", note)
            # Published as desired state: every worker, and every router, applies it.
            server.route_commands(feeds.apply)
        else:
            await supervisor.catch_up(server.control)
            # Given to every worker by the supervisor (operators' commands come that way too).
            server.rollouts.path.apply = supervisor.apply
        await server.serve_forever(started)
    finally:
        orphaned.cancel()
        if feeds is not None:
            await feeds.stop()
        await supervisor.close()
        await client.close()


async def _stop_when_orphaned(parent: int) -> None:
    """Drain and exit, as on SIGTERM, once the supervisor is gone (killed outright, it could
    not tell us): a worker never serves on without the supervisor that zeroes rows."""
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_CHECK_S)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"worker {args.index}: %(message)s")
    fleet = load_fleet(args.config)  # the supervisor checked it: an error here is a bug
    table = LoadTable(args.table_fd, args.workers, len(fleet.replicas))
    for r in range(table.replicas):
        table.write(args.index, r, 0, 0.0)  # start from nothing, whatever a past run left
    front = socket.socket(fileno=args.listen_fd)
    private = _private_socket(socket_path(args.dir, args.index))
    feeds: RouterFeeds | None = None
    server = RouterServer(
        fleet,
        front_socket=front,
        admin_socket=private,
        telemetry=lambda: feeds.status() if feeds is not None else DISABLED,
    )
    if not args.no_telemetry:
        feeds = _feeds(args, fleet, server)
    server.core.shared = SharedLoad(table, args.index)
    client = WorkerClient(args.dir, args.workers)
    server.admin_app = PrivateApi(server.admin, args.index, server.metrics.render, client)
    server.front.render_metrics = ServiceMetrics(
        args.index, server.metrics.render, client, table
    ).render
    supervisor = SupervisorClient(args.dir, args.index)
    try:
        run_loop(_serve(server, table, args.index, client, feeds, supervisor))
    finally:
        table.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
