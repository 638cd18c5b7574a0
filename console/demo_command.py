"""``gpurouter demo``: a live heterogeneous fleet being routed, with nothing installed.

The composition lives in :mod:`router.demo` (the broker, the lab and the router, each in a
child process); this module is its edge: options, the banner with the front door's address
and the admin API's token, the per-second lines of ``--headless`` (read from the router's
admin API), the console otherwise (attached to the router's admin API, with its token, as
``gpurouter console --attach`` is: this process holds what a production console holds), and
errors as one line (a child process that dies ends the demo with its reason, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from console.listen_options import (
    add_listen_options,
    admin_address,
    check_listen_options,
    listen_failure,
)
from router.errors import GpuRouterError

if TYPE_CHECKING:
    from console.app import ConsoleApp
    from console.attach.admin_http import AsyncAdmin
    from console.backend import Backend
    from router.demo import Demo

PROG = "gpurouter demo"
ACTOR = "demo-console"
"""Who the demo's console and headless lines are, in the router's audit trail."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Start the embedded MQTT broker, an emulated fleet with a node agent per node and a "
        "bursty load, and the router, each in a process of its own, then the console attached "
        "to the router (or --headless JSON lines). Round-robin first."
    )
    p.add_argument(
        "--fleet",
        metavar="FILE",
        help="fleet YAML file (default: examples/fleets/mixed-a100-v100.yaml)",
    )
    p.add_argument("--headless", action="store_true", help="no console: print one line a second")
    p.add_argument(
        "--duration", type=float, metavar="S", help="stop after S seconds (default: run on)"
    )
    p.add_argument("--json", action="store_true", help="with --headless: JSON lines on stdout")
    add_listen_options(p)
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="run the emulated GPUs X times faster than life (the load follows)",
    )
    p.add_argument(
        "--load",
        default="0.5:0.9",
        metavar="LOW:HIGH",
        help="the offered rate swings between these fractions of the fleet's capacity",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the load and the emulator")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: the HTTP and MQTT stacks are not needed to build the parser.
    from router.config import load_fleet
    from router.demo import Demo, DemoLoad, DemoOptions, default_fleet_path
    from router.demo.child_process import ChildLostError

    try:
        if args.duration is not None and args.duration <= 0:
            raise GpuRouterError(f"--duration must be > 0, got {args.duration}")
        check_listen_options(args)
        low, high = _fractions(args.load)
        fleet = load_fleet(Path(args.fleet) if args.fleet else default_fleet_path())
        options = DemoOptions(
            time_scale=args.time_scale,
            listen=args.listen,
            admin_listen=admin_address(args, fleet),
            load=DemoLoad(low=low, high=high),
            seed=args.seed,
        )
        demo = Demo(fleet, options)
        if args.headless:
            asyncio.run(_headless(demo, args.duration, args.json, out, err))
        else:
            asyncio.run(_console(demo, args.duration, out))
    except ChildLostError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 1
    except (GpuRouterError, ValueError) as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    except OSError as exc:
        err.write(listen_failure(PROG, exc) + "\n")
        return 1
    return 0


def _fractions(text: str) -> tuple[float, float]:
    low, sep, high = text.partition(":")
    try:
        return float(low), float(high if sep else low)
    except ValueError:
        message = f"--load expects LOW:HIGH fractions such as 0.5:0.9, got {text!r}"
        raise GpuRouterError(message) from None


def banner(demo: Demo) -> list[str]:
    """Where to send requests and commands while the demo runs."""
    front, admin, token = demo.front_url, demo.admin_url, demo.admin_token
    model = demo.fleet.model or demo.fleet.replicas[0].model
    ctl = f"gpurouter ctl --admin {admin} strategy shortest-expected-delay"
    return [
        f"front door: {front}  (try: curl {front}/v1/completions -H 'Content-Type: "
        f'application/json\' -d \'{{"model": "{model}", "prompt": "hi", "max_tokens": 16}}\''
        f" / openai base_url={front}/v1)",
        f"admin API: {admin}  (try: {ctl})"
        if token is None
        else f"admin API: {admin}  token {token}  (try: GPUROUTER_ADMIN_TOKEN={token} {ctl})",
        f"telemetry: MQTT broker {demo.broker_url}, {demo.agent_count} node agents",
        f"load: {demo.options.load.low:g}-{demo.options.load.high:g} of the fleet's capacity "
        f"({demo.capacity_rps:.1f} req/s at time scale 1), "
        f"strategy {demo.fleet.router.strategy.name}",
        f"faults: the emulator's fault API {demo.fault_url}  (try: curl -X POST "
        f'{demo.fault_url}/faults/{demo.fleet.replicas[0].id} -d \'{{"fault": "slow", '
        '"factor": 3}\')',
    ]


async def _headless(
    demo: Demo, duration: float | None, as_json: bool, out: TextIO, err: TextIO
) -> None:
    stop = asyncio.Event()
    demo.on_child_lost = stop.set
    with _signals(stop.set):
        try:
            await demo.start()
            say = err if as_json else out
            say.write("\n".join(banner(demo)) + "\n")
            say.flush()
            async with _admin(demo) as admin:
                await _lines(demo, admin, duration, stop, lambda ln: _print(ln, as_json, out))
        finally:
            await demo.stop()
    if demo.started:
        _print(demo.summary(), as_json, out)
    _raise_if_child_lost(demo)


@contextlib.asynccontextmanager
async def _admin(demo: Demo) -> AsyncIterator[AsyncAdmin]:
    """The demo's router's admin API, and its audit trail followed into the run's tally
    (the strategy switches of the summary) while in the block."""
    from console.attach.admin_http import AsyncAdmin
    from console.attach.events import EventCursor, follow_events

    admin = AsyncAdmin(demo.admin_url, token=demo.admin_token, actor=ACTOR)
    trail = asyncio.create_task(
        follow_events(admin.follow, EventCursor(), demo.record_event, sleep=asyncio.sleep),
        name="demo-events",
    )
    try:
        yield admin
    finally:
        trail.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trail
        await admin.aclose()


def _raise_if_child_lost(demo: Demo) -> None:
    from router.demo.child_process import ChildLostError

    if demo.child_lost is not None:
        raise ChildLostError(demo.child_lost)


async def _lines(
    demo: Demo,
    admin: AsyncAdmin,
    duration: float | None,
    stop: asyncio.Event,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """One line per second of the run, from the router's state as its admin API says it,
    until ``duration`` or ``stop``; a second the router does not answer prints nothing."""
    from console.attach.backend import fetch_state

    loop = asyncio.get_running_loop()
    second = 1
    while duration is None or second <= duration:
        wait = demo.started_at + second - loop.time()
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            return
        try:
            state = await fetch_state(admin)
        except GpuRouterError:
            pass  # a router that went away is reported by the demo, with its reason
        else:
            emit(demo.snapshot_line(state.snapshot, state.telemetry))
        second += 1


def _print(line: dict[str, Any], as_json: bool, out: TextIO) -> None:
    out.write((json.dumps(line) if as_json else _human(line)) + "\n")
    out.flush()


def _human(line: dict[str, Any]) -> str:
    if "summary" in line:
        return "\n".join(summary_lines(line["summary"]))
    nodes = line["telemetry"]["nodes"].values()
    fresh = sum(1 for n in nodes if n["fresh"])
    return (
        f"t={line['t']:>5g}s  {line['strategy']:<28} {line['throughput_rps']:>7.1f} req/s  "
        f"queue {line['queue_depth']:>4}  in flight {line['in_flight']:>4}  "
        f"imbalance {line['imbalance_factor']:.2f} ({line['band']})  "
        f"telemetry {fresh}/{len(nodes)} fresh"
    )


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The end of a run, for people: how the requests ended, then how the fleet did."""
    o = s["outcomes"]
    ended = [f"{o['completed']} completed", f"{o['failed']} failed"]
    ended += [f"{o[k]} {k}" for k in ("rejected", "expired") if o.get(k)]
    if o.get("stopped"):
        ended.append(f"{o['stopped']} ended by the stop (running when it came)")
    imbalance = s["imbalance"]
    lines = [
        f"demo stopped after {s['duration_s']:g} s",
        f"  requests: {', '.join(ended)}; {s['lost']} lost (no HTTP answer at all)",
        f"  throughput: {s['mean_throughput_rps']:.1f} req/s on average"
        + _by_strategy(s["throughput_rps_by_strategy"], ".1f"),
    ]
    if imbalance["mean"] is not None:
        lines.append(
            f"  imbalance: {imbalance['mean']:.2f} on average, {imbalance['max']:.2f} at most"
            + _by_strategy(imbalance["by_strategy"], ".2f")
        )
    switches = [f"t={w['t']:g} s {w['strategy']} ({w['actor']})" for w in s["strategy_switches"]]
    lines.append(f"  strategy switches: {', '.join(switches) or 'none'}")
    return lines


def _by_strategy(values: dict[str, float], spec: str) -> str:
    """`` (round-robin 4.21, weighted-least-connections 1.30)``; one strategy, just its name."""
    if len(values) < 2:
        return f" ({next(iter(values))})" if values else ""
    return " (" + ", ".join(f"{name} {value:{spec}}" for name, value in values.items()) + ")"


@contextlib.asynccontextmanager
async def demo_console(demo: Demo) -> AsyncIterator[ConsoleApp]:
    """The console on a started demo's router, as ``gpurouter console --attach`` is: its
    admin API with the token (full control), the state polled at the console's refresh
    interval and the audit trail followed while in the block. Ctrl+C quits it as q does, and
    it quits by itself if one of the demo's child processes dies. A router in this process
    (an old layout, kept for the benchmark) is watched through the in-process backend."""
    from console.attach.backend import attach

    if not demo.started:
        raise RuntimeError("start the demo before its console")
    if demo.server is not None:
        app = _demo_app(_local_backend(demo))
        demo.on_child_lost = app.exit
        yield app
        return
    remote = await attach(demo.admin_url, token=demo.admin_token, actor=ACTOR)
    remote.front_url = demo.front_url
    remote.notes = banner(demo)
    # The summary's strategy switches, whoever gave them (this console, ctl, the API).
    unsubscribe = remote.subscribe(demo.record_event)
    try:
        app = _demo_app(remote)
        remote.interval = lambda: app.refresh_s
        # A child that dies leaves nothing to watch: the console leaves, the command says why.
        demo.on_child_lost = app.exit
        await remote.start()
        yield app
    finally:
        unsubscribe()
        await remote.stop()


def _demo_app(backend: Backend) -> ConsoleApp:
    from textual.binding import Binding, BindingType

    from console.app import ConsoleApp

    class DemoApp(ConsoleApp):
        # Textual's own Ctrl+C only says how to quit; in the demo it quits.
        BINDINGS: ClassVar[list[BindingType]] = [
            *ConsoleApp.BINDINGS,
            Binding("ctrl+c", "quit", show=False, priority=True),
        ]

    return DemoApp(backend)


def _local_backend(demo: Demo) -> Backend:
    from console.backend import ConsoleBackend

    server = demo.server
    assert server is not None  # the caller checked
    return ConsoleBackend(
        server.core,
        server.control,
        telemetry=demo.telemetry,
        front_url=demo.front_url,
        admin_url=demo.admin_url,
        notes=banner(demo),
        actor=ACTOR,
    )


async def _console(demo: Demo, duration: float | None, out: TextIO) -> None:
    try:
        await demo.start()
        async with demo_console(demo) as app:
            loop = asyncio.get_running_loop()
            if duration is not None:
                loop.call_later(duration, app.exit)
            if demo.child_lost is not None:  # lost before the console was there to hear it
                loop.call_soon(app.exit)
            with _signals(app.exit):
                await app.run_async()
    except GpuRouterError:
        _raise_if_child_lost(demo)  # a router gone before the console attached: say why
        raise
    finally:
        await demo.stop()
    if demo.started:
        out.write(banner(demo)[0] + "\n")
        out.write("\n".join(summary_lines(demo.summary()["summary"])) + "\n")
    _raise_if_child_lost(demo)


@contextlib.contextmanager
def _signals(handler: Callable[[], object]) -> Iterator[None]:
    """SIGINT and SIGTERM call ``handler`` while in the block (then the defaults return)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handler)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
