"""The console at scale: 512 GPUs (64 nodes x 8) changing every second.

    python bench/bench_console.py              # 20 s per variant, 80x24 and 160x48
    python bench/bench_console.py --seconds 5  # quicker

The console runs headless (``App.run_test``) with its real 1 Hz refresh timer. Once a second
an updater changes the data the way a live fleet does: every GPU's reading (utilization,
memory, power, temperature), a few hundred requests started and finished on the router core,
the feed ages. Two variants run side by side, at two terminal sizes:

- ``diff``: the shipped table, which writes only cells whose text or tone changed;
- ``full``: the same table forced to rewrite every cell on each refresh.

CPU is ``time.process_time`` over the run divided by wall time (share of one core); the
updater's own CPU is measured and subtracted, so ``console`` is what the console costs.
Key-to-screen latency is from handing a key to the app (as the terminal driver does) to the
last frame that changed what the terminal shows (a change can take several frames: the
table, then its scrollbar), while the 1 Hz refresh keeps running. Frames are encoded for
the terminal, as outside a test. The
keys: ``?`` opens help and Escape closes it, ``o`` re-sorts the 512 rows, ``/`` opens the
filter box, ``7`` narrows the table, Escape clears the filter, ``v`` opens the rollout form
and Escape closes it. Aim (issue 4): under 25% of one
core, under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.segment import ControlType
from textual import events
from textual._compositor import CompositorUpdate
from textual.message_pump import MessagePump
from textual.screen import Screen

from console.app import ConsoleApp
from console.backend import ConsoleBackend, GpuKey
from console.rollout.form import RolloutForm
from console.screens.help import HelpScreen
from console.widgets.filter_input import FilterInput
from console.widgets.fleet_table import FleetTable
from router.clock import ManualClock
from router.config.schema import FleetConfig, GpuConfig, NodeConfig, ReplicaConfig, RouterConfig
from router.control import ControlSurface
from router.core import RouterCore
from router.replica import Telemetry
from router.request import Priority, Request
from router.telemetry.schema import GpuSample
from router.telemetry.status import BrokerState, NodeFeed, TelemetryStatus

MODELS = (("H100-SXM", 3.7, 80), ("A100-80GB", 2.2, 80), ("L4", 0.35, 24))


def big_fleet(nodes: int = 64, per_node: int = 8) -> FleetConfig:
    out = []
    for n in range(nodes):
        model, weight, mem = MODELS[n % len(MODELS)]
        name = f"node-{n:02d}"
        gpus = tuple(GpuConfig(i, model, mem) for i in range(per_node))
        reps = tuple(
            ReplicaConfig(
                id=f"{name}-g{i}",
                node=name,
                endpoint=f"http://127.0.0.1:{20000 + n * per_node + i}",
                model="m",
                gpus=(i,),
                gpu_model=model,
                weight=weight,
                batch_size=32,
            )
            for i in range(per_node)
        )
        out.append(NodeConfig(name, gpus, reps))
    # No decision explanations: their cost is the router's, not the console's.
    return FleetConfig(
        nodes=tuple(out), cluster="bench-512", router=RouterConfig(decision_log_size=0)
    )


class Updater:
    """Changes readings and load once per call, as a live fleet does in a second."""

    def __init__(self, fleet: FleetConfig, seed: int = 1) -> None:
        self.fleet = fleet
        self.clock = ManualClock(0.0)
        self.core = RouterCore(fleet, clock=self.clock, rng=random.Random(seed))
        self.control = ControlSurface(self.core, wall_clock=lambda: 1_700_000_000.0)
        self.rng = random.Random(seed)
        self.samples: dict[GpuKey, GpuSample] = {}
        self.n = 0
        self.cpu = 0.0

    def backend(self) -> ConsoleBackend:
        return ConsoleBackend(
            self.core, self.control, telemetry=self.status, gpu_samples=lambda: self.samples
        )

    def step(self) -> None:
        # No collection starts inside a step: one would charge garbage the console made to
        # the updater's CPU, which is subtracted from the console's.
        gc.disable()
        try:
            self._step()
        finally:
            gc.enable()

    def _step(self) -> None:
        start = time.process_time()
        self.clock.advance(1.0)
        now = self.clock()
        running = list(self.core.running.values())
        for a in self.rng.sample(running, min(len(running), 300)):
            self.core.complete(a)
        for _ in range(300 if len(self.core.running) < 6000 else 0):
            self.n += 1
            self.core.submit(Request(f"r{self.n}", 300, 100, now, Priority(self.n % 3)))
        for node in self.fleet.nodes:
            for rc in node.replicas:
                util = self.rng.random()
                self.core.replica(rc.id).telemetry = Telemetry(util, now)
                i = rc.gpus[0]
                self.samples[(node.name, i)] = GpuSample(
                    index=i,
                    gpu_util_pct=round(util * 100),
                    fb_used_mib=self.rng.randint(20_000, 80_000),
                    fb_total_mib=81_920,
                    power_w=float(self.rng.randint(100, 700)),
                    power_limit_w=700.0,
                    temp_c=self.rng.randint(40, 85),
                    replica=rc.id,
                )
        self.cpu += time.process_time() - start

    def status(self) -> TelemetryStatus:
        feeds = tuple(
            NodeFeed(n.name, True, 0.4, False, 1, 0, int(self.clock()), 0, 0)
            for n in self.fleet.nodes
        )
        return TelemetryStatus(BrokerState.CONNECTED, "mqtt://127.0.0.1:1883", feeds)


@dataclass
class Result:
    variant: str
    size: tuple[int, int]
    wall_s: float
    total_cpu: float
    updater_cpu: float
    refreshes: int
    cells_per_refresh: float
    keys_ms: dict[str, list[float]]
    """Key-to-screen milliseconds of each press, by what the key does (see KEYS)."""

    @property
    def console_share(self) -> float:
        return (self.total_cpu - self.updater_cpu) / self.wall_s


class Paints:
    """When the app last changed what its terminal shows.

    Each frame is encoded for the terminal, as Textual's driver does outside a test (headless,
    it skips that work, which a user's console pays), and applied to a copy of the screen,
    cell by cell. A frame that repaints cells with what they already hold (a scrollbar
    restyled on a focus change, say) shows nothing new, so it does not end a key.
    """

    def __init__(self, app: ConsoleApp) -> None:
        self.frames = 0
        self.changed = 0.0
        self.changes: list[float] = []
        """When each frame that changed the screen was written, since the key began (cleared
        by :func:`key_to_screen`)."""
        self._cells: dict[tuple[int, int], tuple[str, object]] = {}
        display, console = app._display, app.console

        def timed(screen: Screen[object], renderable: RenderableType | None) -> None:
            display(screen, renderable)
            if not isinstance(renderable, CompositorUpdate):
                return
            renderable.render_segments(console)
            now = time.perf_counter()
            self.frames += 1
            if self._apply(renderable, console):
                self.changed = now
                self.changes.append(now)

        app._display = timed  # type: ignore[method-assign]

    def _apply(self, update: CompositorUpdate, console: Console) -> bool:
        """Write the update into the copy of the screen; True if a cell changed."""
        cells, changed = self._cells, False
        x = y = 0
        for segment in console.render(cast(RenderableType, update)):
            if segment.control:
                for code in segment.control:
                    if code[0] == ControlType.CURSOR_MOVE_TO and len(code) == 3:
                        x, y = int(code[1]), int(code[2])
                continue
            if segment.text == "\n":
                continue
            for char in segment.text:
                cell = (char, segment.style)
                if cells.get((x, y)) != cell:
                    cells[(x, y)] = cell
                    changed = True
                x += cell_len(char)
        return changed


async def key_to_screen(
    app: ConsoleApp,
    paints: Paints,
    key: str,
    char: str,
    done: Callable[[], bool],
    first: list[float] | None = None,
) -> float:
    """Milliseconds from a key reaching the app to the last frame that changed the screen.

    The key is done once its effect is in the app's state (``done``) and then nothing is
    queued for the app or any widget on its screen, nothing is pending for the screen's next
    frame and no frame was written, three checks running, 2 ms apart. The checks read
    Textual's queues and flags and post nothing; what measuring adds to the loop is the copy
    of the screen that each frame is applied to (:class:`Paints`), paid before and after alike.

    ``first`` gets the milliseconds to the first frame that changed the screen once the
    effect was in the state: where the key's effect is first seen. Whatever else comes to
    the screen before it is quiet (the 1 s refresh landing just after it, say) counts in the
    figure returned, not in that one.
    """
    start = time.perf_counter()
    paints.changes.clear()
    # The driver is where a terminal's keys enter the app; Pilot's press() would add its
    # own idle waits, which measure the machine's load rather than the console.
    assert app._driver is not None
    app._driver.send_message(events.Key(key, char))
    unchanged = start  # when the state was last seen without the key's effect
    while not done():
        unchanged = time.perf_counter()
        if unchanged - start > 10:
            raise RuntimeError(f"key {key!r} showed no effect in 10 s")
        await asyncio.sleep(0.0005)
    quiet = 0
    while quiet < 3:
        frames = paints.frames
        await asyncio.sleep(0.002)
        busy = paints.frames != frames or _pending(app.screen) or _queued(app)
        quiet = 0 if busy else quiet + 1
    last = max(paints.changed, start)
    if first is not None:
        shown = next((t for t in paints.changes if t >= unchanged), last)
        first.append((shown - start) * 1000)
    return (last - start) * 1000


def _queued(app: ConsoleApp) -> bool:
    """Messages waiting for the app or any widget on its screen."""
    pumps: list[MessagePump] = [app, *app.screen.walk_children(with_self=True)]
    return any(not pump._message_queue.empty() for pump in pumps)


def _pending(screen: Screen[object]) -> bool:
    """Work the screen holds for its next frame (Textual's own flags)."""
    return bool(
        screen._layout_required
        or screen._scroll_required
        or screen._repaint_required
        or screen._recompose_required
        or screen._dirty_widgets
    )


async def run(variant: str, size: tuple[int, int], seconds: float, presses: int) -> Result:
    updater = Updater(big_fleet())
    updater.step()
    app = ConsoleApp(updater.backend(), refresh_s=1.0)
    if variant == "full":
        draw = app._draw
        # The same table with the difference switched off: every cell rewritten.
        app._draw = lambda force=False: draw(force=True)  # type: ignore[method-assign]  # noqa: ARG005
    refreshes = 0
    publish = app.refreshed_signal

    def count(_: object) -> None:
        nonlocal refreshes
        refreshes += 1

    async with app.run_test(size=size) as pilot:
        paints = Paints(app)
        publish.subscribe(app, count)
        table = app.query_one(FleetTable)
        await pilot.pause()
        cells0, refreshes0 = table.cell_updates, refreshes
        wall0, cpu0, updater0 = time.perf_counter(), time.process_time(), updater.cpu
        deadline = wall0 + seconds
        while time.perf_counter() < deadline:
            updater.step()
            await asyncio.sleep(1.0)
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        # The updater goes on while the keys are pressed; only its CPU in this window counts.
        updater_cpu = updater.cpu - updater0
        done = refreshes - refreshes0
        cells = (table.cell_updates - cells0) / max(1, done)
        # The data keeps changing while keys are pressed, so a key can land on a full refresh.
        feed = asyncio.create_task(_keep_updating(updater))
        keys_ms: dict[str, list[float]] = {name: [] for name in KEYS}
        try:
            for i in range(presses):
                for j, (name, (key, char, shown)) in enumerate(KEYS.items()):
                    before = app.sort_mode
                    keys_ms[name].append(
                        await key_to_screen(app, paints, key, char, shown(app, before))
                    )
                    # Land the next key at another phase of the 1 s refresh.
                    await asyncio.sleep(0.05 + 0.37 * ((i * len(KEYS) + j) % 7) / 7)
        finally:
            feed.cancel()
    return Result(variant, size, wall, cpu, updater_cpu, done, cells, keys_ms)


async def _keep_updating(updater: Updater) -> None:
    while True:
        await asyncio.sleep(1.0)
        updater.step()


def _filtered(text: str) -> Callable[[ConsoleApp, str], Callable[[], bool]]:
    return lambda app, _: lambda: app.filter_text == text


KEYS: dict[str, tuple[str, str, Callable[[ConsoleApp, str], Callable[[], bool]]]] = {
    "help ?": ("question_mark", "?", lambda app, _: lambda: isinstance(app.screen, HelpScreen)),
    "close help": ("escape", "\x1b", lambda app, _: lambda: not isinstance(app.screen, HelpScreen)),
    "sort o": ("o", "o", lambda app, before: lambda: app.sort_mode != before),
    "filter /": ("slash", "/", lambda app, _: lambda: isinstance(app.focused, FilterInput)),
    "type 7": ("7", "7", _filtered("7")),
    "clear esc": ("escape", "\x1b", _filtered("")),
    "rollout v": ("v", "v", lambda app, _: lambda: isinstance(app.screen, RolloutForm)),
    "close form": (
        "escape",
        "\x1b",
        lambda app, _: lambda: not isinstance(app.screen, RolloutForm),
    ),
}
"""Each key: (key, character, when its effect is in the app). Six sort presses cycle through
every order, into and out of the node grouping (which adds or removes 64 heading rows)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--presses", type=int, default=12, help="presses of each key")
    parser.add_argument("--variants", default="diff,full")
    args = parser.parse_args()
    results = [
        asyncio.run(run(variant, size, args.seconds, args.presses))
        for size in ((80, 24), (160, 48))
        for variant in args.variants.split(",")
    ]
    print(f"{platform.python_version()} on {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print(
        "| size | variant | refreshes | cells written/refresh | console CPU (% of a core) "
        "| vs diff | " + " | ".join(f"{name} p50/max ms" for name in KEYS) + " |"
    )
    print("|---|---|---|---|---|---|" + "---|" * len(KEYS))
    base: dict[tuple[int, int], float] = {}
    for r in results:
        share = r.console_share
        base.setdefault(r.size, share)
        ratio = share / base[r.size] if base[r.size] else float("nan")
        print(
            f"| {r.size[0]}x{r.size[1]} | {r.variant} | {r.refreshes} | {r.cells_per_refresh:,.0f} "
            f"| {share * 100:.1f} | {ratio:.2f}x | "
            + " | ".join(f"{statistics.median(ms):.0f}/{max(ms):.0f}" for ms in r.keys_ms.values())
            + " |"
        )
    keys = [ms for r in results if r.variant == "diff" for ms in r.keys_ms.values()]
    every = [m for ms in keys for m in ms]
    if every:
        over = sum(m > 100 for m in every)
        print(f"diff: {over} of {len(every)} presses over 100 ms, slowest {max(every):.0f} ms")


if __name__ == "__main__":
    main()
