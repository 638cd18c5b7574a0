"""``python -m router.demo.router_child``: the demo's router in a process of its own.

What ``gpurouter serve`` runs for one fleet (the front door, the admin API with its bearer
token, and the telemetry subscriber fed by the node agents over MQTT), started from a
:class:`RouterPlan` read on stdin instead of options, so that the demo's console process
holds what a production console holds: a console attached to a router through its admin API.
Started by :class:`router.demo.router_process.RouterProcess`, it answers
:class:`RouterReady` with its two addresses (or :class:`StartFailed`) on stdout; everything
after goes through the admin API, as to any router.

It stops when its stdin closes (the parent closed it, or the parent is gone: no router
outlives its console), or on SIGTERM or SIGINT: the subscriber, then the router with half a
second of grace for the requests in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from typing import TYPE_CHECKING

from router.demo.channel import RouterPlan, RouterReady, StartFailed, decode
from router.demo.child_io import Send, run_child, run_until_stopped
from router.errors import GpuRouterError
from router.event_loop import run_loop
from router.telemetry.status import DISABLED

if TYPE_CHECKING:
    from router.http.server import RouterServer
    from router.telemetry.subscriber import TelemetrySubscriber

_GRACE_S = 0.5
"""What the demo's router gives the requests in flight at its stop (the load has stopped
and drained already)."""


async def serve(reader: asyncio.StreamReader, send: Send, stop: asyncio.Event) -> int:
    """Run the router the parent asks for; 0 after a stop, 1 if it could not start."""
    try:
        plan = decode(await reader.readline())
    except ValueError:
        return 1  # no plan: the parent went away before sending it
    if not isinstance(plan, RouterPlan):
        return 1
    try:
        server, subscriber = await _start(plan)
    except OSError as exc:
        send(_os_failure(exc))
        return 1
    except GpuRouterError as exc:
        send(StartFailed("config", str(exc)))
        return 1
    send(RouterReady(server.front_url, server.admin_url))
    try:
        await run_until_stopped(stop, _until_eof(reader))
    finally:
        await subscriber.stop()
        await server.stop(_GRACE_S)
    return 0


async def _start(plan: RouterPlan) -> tuple[RouterServer, TelemetrySubscriber]:
    from router.config import load_fleet
    from router.config.schema import StrategyConfig
    from router.http.server import RouterServer
    from router.telemetry.subscriber import TelemetrySubscriber

    fleet = load_fleet(plan.fleet_file)
    router = dataclasses.replace(fleet.router, strategy=StrategyConfig(plan.strategy))
    fleet = dataclasses.replace(fleet, router=router)
    subscriber: TelemetrySubscriber | None = None
    server = RouterServer(
        fleet,
        listen=plan.listen,
        admin_listen=plan.admin_listen,
        admin_token=plan.admin_token,
        telemetry=lambda: subscriber.status() if subscriber is not None else DISABLED,
    )
    await server.start()
    try:
        subscriber = TelemetrySubscriber(fleet, server.core, broker=plan.broker_url)
        await subscriber.start()
    except BaseException:
        await server.stop(0)
        raise
    return server, subscriber


async def _until_eof(reader: asyncio.StreamReader) -> None:
    """The parent says nothing after the plan: its end of the pipe closing is the stop."""
    while await reader.readline():
        pass


def _os_failure(exc: OSError) -> StartFailed:
    from router.http.server import ListenError

    if isinstance(exc, ListenError):
        return StartFailed(
            "os", exc.strerror or str(exc), exc.errno, exc.listener, exc.address, exc.setting
        )
    return StartFailed("os", str(exc), exc.errno)


def main() -> int:
    codes: list[int] = []

    async def child() -> None:
        codes.append(await run_child(serve))

    # uvloop where it is installed, as `gpurouter serve` runs.
    run_loop(child())
    return codes[0] if codes else 1


if __name__ == "__main__":
    sys.exit(main())
