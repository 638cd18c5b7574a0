"""Key-to-screen latency in the real demo at its default load (issue 15, point 5).

    python bench/bench_demo_keys.py                  # attached, then child (old vs new)
    python bench/bench_demo_keys.py --json           # the same, as one JSON object
    python bench/bench_demo_keys.py --layouts attached --presses 5 --warmup 20

Each layout runs the whole demo as ``gpurouter demo`` does: the embedded broker, the lab
(emulated fleet of the default fleet file, one node agent per node, the open-loop load at
0.5-0.9 of the fleet's capacity), the router, and the console (``App.run_test``, the real
1 Hz refresh). ``attached`` is the demo as shipped: the lab and the router each in a process
of its own, the console attached to the router's admin API (``gpurouter console --attach``'s
backend, with the token), so the console's process holds only the console. ``child`` is the
layout before it: the lab in a child, the router on the console's loop
(``DemoOptions(router_in_process=True)``); ``in-process`` runs the lab there too, as the demo
did before that (``DemoOptions(lab_in_process=True)``). The fleet file is the default one
with its replicas moved to free loopback ports.

After ``--warmup`` seconds (the load's first phase fills the fleet: several hundred requests
in flight), each round presses ``s`` (the strategy picker), Escape, ``i`` (the selected
replica's detail), Escape, ``?`` (help), Escape, ``d`` (the drain's confirmation, with its
impact) and ``n`` (cancelled: nothing is drained), with a pause between keys that lands each one
at another phase of the refresh. A key's latency is from the key reaching the app (its
driver, where a terminal's keys enter) to the last frame that changed what the terminal shows,
frames encoded for the terminal as outside a test (bench/bench_console.py's
``key_to_screen``), here with the real data plane running, not a fake core: the aim's
figure. Beside it, all keys to the first frame that showed the key's effect: the difference
is what else reached the screen before it was quiet (a refresh landing just after the key's
frame). Also reported: requests in flight at the router (as the console last saw them:
attached, its latest poll of the admin API) and at the load generator at each key, the
console process's CPU (and the router process's, when it has one), how late the console's
loop ran a 10 ms timer (its lag), the garbage collector's passes by generation
(``gc.callbacks``), and the load average. ``child-young`` is ``child`` with other
collector thresholds (see ``LAYOUTS``). Bounded: ``--presses`` rounds and ``--max-seconds``
of keys per layout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_console import Paints, key_to_screen

import console.app
from console.app import ConsoleApp
from console.demo_command import demo_console
from console.screens.confirm import ConfirmScreen
from console.screens.help import HelpScreen
from console.screens.replica_detail import ReplicaDetail
from console.screens.strategy_picker import StrategyPicker
from router.config import load_fleet
from router.demo import Demo, DemoLoad, DemoOptions, default_fleet_path

LAYOUTS = ("attached", "child", "in-process", "child-young")
"""``child-young``: ``child`` with the console's garbage collector thresholds at (5000, 10,
10): shorter young passes, more of them, and full passes."""
Done = Callable[[ConsoleApp], bool]


def _on(screen: type) -> Done:
    return lambda app: isinstance(app.screen, screen)


def _back(screen: type) -> Done:
    return lambda app: not isinstance(app.screen, screen)


KEYS: tuple[tuple[str, str, str, Done], ...] = (
    ("strategy s", "s", "s", _on(StrategyPicker)),
    ("close picker esc", "escape", "\x1b", _back(StrategyPicker)),
    ("detail i", "i", "i", _on(ReplicaDetail)),
    ("close detail esc", "escape", "\x1b", _back(ReplicaDetail)),
    ("help ?", "question_mark", "?", _on(HelpScreen)),
    ("close help esc", "escape", "\x1b", _back(HelpScreen)),
    ("drain d", "d", "d", _on(ConfirmScreen)),
    ("cancel drain n", "n", "n", _back(ConfirmScreen)),
)
"""Each key: (name, key, character, when its effect is in the app)."""


@dataclass(slots=True)
class Result:
    layout: str
    keys_ms: dict[str, list[float]] = field(default_factory=dict)
    first_ms: dict[str, list[float]] = field(default_factory=dict)
    """To the first frame that showed the key's effect (``key_to_screen``'s ``first``)."""
    in_flight: list[int] = field(default_factory=list)
    """Requests running on replicas, at the router, at each key."""
    client_in_flight: list[int] = field(default_factory=list)
    """Requests the load generator had sent and not seen end, at each key."""
    lag_ms: list[float] = field(default_factory=list)
    gc_ms: dict[int, list[float]] = field(default_factory=lambda: {0: [], 1: [], 2: []})
    """The garbage collector's passes while the keys ran, by generation (``gc.callbacks``)."""
    console_cpu: float = 0.0
    """The console process's CPU over the keys' wall time (share of one core)."""
    router_cpu: float | None = None
    """The router process's, when the router has a process of its own."""
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """At the end of the layout's keys."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fleet_on_free_ports(directory: Path) -> Path:
    """The default fleet file with each replica's loopback port replaced by a free one."""
    text = default_fleet_path().read_text(encoding="utf-8")
    moved = re.sub(r"http://127\.0\.0\.1:\d+", lambda _: f"http://127.0.0.1:{free_port()}", text)
    path = directory / "fleet.yaml"
    path.write_text(moved, encoding="utf-8")
    return path


async def measure_lag(into: list[float]) -> None:
    """How late the loop runs a 10 ms timer, each time, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(0.01)
        into.append((loop.time() - asked - 0.01) * 1000)


async def run(layout: str, fleet_file: Path, args: argparse.Namespace) -> Result:
    if layout == "child-young":
        console.app.GC_THRESHOLDS = (5_000, 10, 10)
    options = DemoOptions(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        load=DemoLoad(low=args.low, high=args.high),
        lab_in_process=layout == "in-process",
        router_in_process=layout in ("child", "child-young"),
    )
    demo = Demo(load_fleet(fleet_file), options)
    await demo.start()
    result = Result(layout, {name: [] for name, *_ in KEYS}, {name: [] for name, *_ in KEYS})
    try:
        async with (
            demo_console(demo) as app,
            app.run_test(size=(args.width, args.height)) as pilot,
        ):
            paints = Paints(app)
            await pilot.pause()
            await asyncio.sleep(args.warmup)
            await press_keys(app, paints, demo, result, args)
    finally:
        await demo.stop()
    return result


async def press_keys(
    app: ConsoleApp, paints: Paints, demo: Demo, result: Result, args: argparse.Namespace
) -> None:
    lag = asyncio.create_task(measure_lag(result.lag_ms))
    watch = _gc_watch(result.gc_ms)
    gc.callbacks.append(watch)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    router0 = _cpu_s(demo.router_pid)
    deadline = wall0 + args.max_seconds
    try:
        for i in range(args.presses):
            for j, (name, key, char, done) in enumerate(KEYS):
                result.in_flight.append(app.backend.snapshot().in_flight)
                result.client_in_flight.append(demo.client_tally().in_flight)
                ms = await key_to_screen(
                    app, paints, key, char, _bound(done, app), result.first_ms[name]
                )
                result.keys_ms[name].append(ms)
                # Land the next key at another phase of the 1 s refresh.
                await asyncio.sleep(0.05 + 0.37 * ((i * len(KEYS) + j) % 7) / 7)
            if time.perf_counter() > deadline:
                break
    finally:
        lag.cancel()
        gc.callbacks.remove(watch)
        wall = time.perf_counter() - wall0
        result.console_cpu = (time.process_time() - cpu0) / wall
        router1 = _cpu_s(demo.router_pid)
        if router0 is not None and router1 is not None:
            result.router_cpu = (router1 - router0) / wall
        result.loadavg = os.getloadavg()


def _cpu_s(pid: int | None) -> float | None:
    """CPU seconds ``pid`` has used (user and system, from /proc); None without one."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime and stime: the 14th and 15th fields of stat, the 12th and 13th after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gc_watch(into: dict[int, list[float]]) -> Callable[[str, dict[str, int]], None]:
    """A ``gc.callbacks`` entry that times each pass into ``into`` by generation."""
    began = 0.0

    def watch(phase: str, info: dict[str, int]) -> None:
        nonlocal began
        if phase == "start":
            began = time.perf_counter()
        else:
            into[info["generation"]].append((time.perf_counter() - began) * 1000)

    return watch


def _bound(done: Done, app: ConsoleApp) -> Callable[[], bool]:
    return lambda: done(app)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (with few samples, p99 is the maximum)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 1),
        "p90": round(percentile(values, 90), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
    }


def summary(result: Result) -> dict[str, Any]:
    every = [ms for values in result.keys_ms.values() for ms in values]
    return {
        "layout": result.layout,
        "keys_ms": {name: stats(values) for name, values in result.keys_ms.items()},
        "all_keys_ms": stats(every),
        "all_keys_first_frame_ms": stats(
            [ms for values in result.first_ms.values() for ms in values]
        ),
        "in_flight": _spread(result.in_flight),
        "client_in_flight": _spread(result.client_in_flight),
        "loop_lag_ms": stats(result.lag_ms),
        "gc_ms": {
            str(g): stats(ms) | {"total": round(sum(ms), 1)} for g, ms in result.gc_ms.items()
        },
        "console_cpu_percent": round(result.console_cpu * 100, 1),
        "router_cpu_percent": None
        if result.router_cpu is None
        else round(result.router_cpu * 100, 1),
        "loadavg": [round(x, 2) for x in result.loadavg],
    }


def _spread(values: list[int]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "mean": round(statistics.fmean(values)), "max": max(values)}


def print_table(report: dict[str, Any]) -> None:
    print(
        f"Python {report['python']} on {report['cpus']} CPUs; load average "
        f"{report['loadavg_start']} at start, {report['loadavg_end']} at the end; "
        f"size {report['size']}; "
        f"{report['presses']} rounds after {report['warmup_s']:g} s of warm-up"
    )
    print("| layout | key | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    for layout in report["layouts"]:
        rows = [*layout["keys_ms"].items(), ("all keys", layout["all_keys_ms"])]
        for name, s in rows:
            print(
                f"| {layout['layout']} | {name} | {s['n']} | {s['p50']:.0f} | {s['p90']:.0f} "
                f"| {s['p99']:.0f} | {s['max']:.0f} |"
            )
        f = layout.get("all_keys_first_frame_ms")
        if f:
            print(
                f"| {layout['layout']} | all keys, to the first frame showing the effect "
                f"| {f['n']} | {f['p50']:.0f} | {f['p90']:.0f} | {f['p99']:.0f} | {f['max']:.0f} |"
            )
    print()
    print(
        "| layout | in flight at the router (min/mean/max) | at the load generator "
        "| console CPU (% of a core) | router process CPU | loop lag p50/p99/max ms "
        "| load average after |"
    )
    print("|---|---|---|---|---|---|---|")
    for layout in report["layouts"]:
        f, c, lag = layout["in_flight"], layout["client_in_flight"], layout["loop_lag_ms"]
        print(
            f"| {layout['layout']} | {f['min']}/{f['mean']}/{f['max']} "
            f"| {c['min']}/{c['mean']}/{c['max']} | {layout['console_cpu_percent']} "
            f"| {_or_dash(layout['router_cpu_percent'])} "
            f"| {lag['p50']:.0f}/{lag['p99']:.0f}/{lag['max']:.0f} | {layout['loadavg']} |"
        )
    print()
    print("| layout | generation | passes | p50 ms | max ms | total ms |")
    print("|---|---|---|---|---|---|")
    for layout in report["layouts"]:
        for generation, g in layout["gc_ms"].items():
            if g.get("n"):
                print(
                    f"| {layout['layout']} | {generation} | {g['n']} | {g['p50']:.1f} "
                    f"| {g['max']:.1f} | {g['total']:.0f} |"
                )


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def one_layout(layout: str) -> dict[str, Any]:
    """This benchmark run again for ``layout`` alone, its JSON report."""
    argv = [a for a in sys.argv[1:] if a != "--json"]
    flags = [*_without(argv, "--layouts"), "--layouts", layout, "--json"]
    done = subprocess.run(
        [sys.executable, __file__, *flags], stdout=subprocess.PIPE, check=True, text=True
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _without(argv: list[str], flag: str) -> list[str]:
    """``argv`` less ``flag`` and its value (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layouts", default="attached,child", help=", ".join(LAYOUTS))
    parser.add_argument("--presses", type=int, default=7, help="rounds of the six keys")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before the keys")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="keys per layout")
    parser.add_argument("--low", type=float, default=0.5, help="the load's low fraction")
    parser.add_argument("--high", type=float, default=0.9, help="the load's high fraction")
    parser.add_argument("--width", type=int, default=120)
    parser.add_argument("--height", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}")
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "size": f"{args.width}x{args.height}",
        "presses": args.presses,
        "warmup_s": args.warmup,
        "layouts": [],
    }
    if len(layouts) == 1:
        with tempfile.TemporaryDirectory() as directory:
            fleet_file = fleet_on_free_ports(Path(directory))
            report["layouts"].append(summary(asyncio.run(run(layouts[0], fleet_file, args))))
    else:
        # Each layout in a fresh process of its own, as a user starts the demo: nothing of
        # one run (threads, worker processes, garbage) weighs on the next.
        for layout in layouts:
            report["layouts"].extend(one_layout(layout)["layouts"])
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)


if __name__ == "__main__":
    main()
