"""A traffic split as lines of cells: a canary's share, schedule and the judge's figures for
both versions, or a blue-green set's replicas and what the blue set still holds.

Pure functions of :mod:`console.rollout.split_model`'s types, so the split screen is tested
without a terminal; the words carry the meaning, the tones only colour it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.rollout.split_model import BlueGreenState, CanaryState, SplitState, VersionFigures
from console.view.format import Cell, Tone, pct

__all__ = [
    "Line",
    "blue_green_lines",
    "canary_lines",
    "canary_request_lines",
    "split_lines",
    "steering_lines",
]

Line = tuple[Cell, ...]

_CANARY_TONES = {
    "promoted": Tone.OK,
    "rolled back": Tone.WARN,
    "rolling back": Tone.WARN,
    "aborted": Tone.WARN,
    "failed": Tone.BAD,
}
_SET_TONES = {"active": Tone.OK, "draining": Tone.WARN, "drained": Tone.DIM}


def split_lines(state: SplitState) -> list[Line]:
    if isinstance(state, CanaryState):
        return canary_lines(state)
    return blue_green_lines(state)


def canary_lines(c: CanaryState) -> list[Line]:
    """Phase and versions, the share now against the schedule, the judge's figures for the
    new and the old version over its window, the verdict and the rollout that moved its
    replicas."""
    lines: list[Line] = [
        (
            (f"{c.id}: {c.new} on {', '.join(c.replicas)} beside {c.old} ", Tone.NORMAL),
            (c.phase, _CANARY_TONES.get(c.phase, Tone.ACCENT)),
        ),
        (
            ("share now ", Tone.DIM),
            (f"{pct(c.share)} of {c.model}", Tone.NORMAL),
            (" to the new version", Tone.DIM),
        ),
        _schedule(c),
        (),
        ((_head(c), Tone.DIM),),
        _figures_line("new", c.new, c.new_figures, c),
        _figures_line("old", c.old, c.old_figures, c),
    ]
    if c.verdict is not None:
        lines.extend(((), (("rolled back: ", Tone.WARN), (c.verdict, Tone.NORMAL))))
    elif c.error is not None:
        lines.extend(((), (("error: ", Tone.BAD), (c.error, Tone.BAD))))
    if c.rollout is not None:
        lines.append(((f"its replicas moved by {c.rollout} (v shows it)", Tone.DIM),))
    return lines


def _schedule(c: CanaryState) -> Line:
    if not c.auto:
        return (("steps: ", Tone.DIM), ("by the operator (s sets the share)", Tone.NORMAL))
    cells: list[Cell] = [("steps: ", Tone.DIM)]
    for i, share in enumerate(c.steps):
        if i:
            cells.append((" → ", Tone.DIM))
        here = c.step == i and c.going
        cells.append(
            (f"[{pct(share)}]" if here else pct(share), Tone.ACCENT if here else Tone.NORMAL)
        )
    cells.append((", then promoted", Tone.DIM))
    return tuple(cells)


def _head(c: CanaryState) -> str:
    return _row("judged over its window", "REQUESTS", "ERRORS", "ERROR RATE", "P99 TTFT", c)


def _name_width(c: CanaryState) -> int:
    return max(len("judged over its window"), 4 + len(c.new), 4 + len(c.old))


def _row(name: str, requests: str, errors: str, rate: str, p99: str, c: CanaryState) -> str:
    return f"{name:<{_name_width(c)}}  {requests:>8}  {errors:>6}  {rate:>10}  {p99:>8}"


def _figures_line(side: str, version: str, f: VersionFigures, c: CanaryState) -> Line:
    p99 = "-" if f.p99_ttft_s is None else f"{f.p99_ttft_s * 1000:.0f} ms"
    row = _row(f"{side} {version}", str(f.requests), str(f.errors), f"{f.error_rate:.1%}", p99, c)
    worse = side == "new" and c.judged is not None
    return ((row, Tone.BAD if worse else Tone.NORMAL),)


def blue_green_lines(b: BlueGreenState) -> list[Line]:
    """Phase and shares, each replica of both sets with its state, version and requests in
    flight, and what the blue set still holds (empty: it may be released)."""
    tone = {"switched": Tone.ACCENT, "released": Tone.OK}.get(b.phase, Tone.NORMAL)
    lines: list[Line] = [
        ((f"{b.id}: {b.model} ", Tone.NORMAL), (b.phase, tone)),
        (
            ("share ", Tone.DIM),
            (f"{b.new} {pct(b.share)}, {b.old} {pct(1 - b.share)}", Tone.NORMAL),
        ),
        (),
    ]
    members = [("blue", m) for m in b.blue] + [("green", m) for m in b.green]
    width = max([len("REPLICA"), *(len(m.replica) for _, m in members)])
    versions = max([len("VERSION"), *(len(m.version) for _, m in members)])
    head = f"SET    {'REPLICA':<{width}}  {'STATE':<8}  {'VERSION':<{versions}}  IN FLIGHT"
    lines.append(((head, Tone.DIM),))
    for side, m in members:
        lines.append(
            (
                (f"{side:<5}  {m.replica:<{width}}  ", Tone.NORMAL),
                (f"{m.state:<8}", _SET_TONES.get(m.state, Tone.BAD)),
                (f"  {m.version:<{versions}}  {m.in_flight:>9}", Tone.NORMAL),
            )
        )
    lines.append(())
    lines.append(_blue_set(b))
    return lines


def _blue_set(b: BlueGreenState) -> Line:
    if b.phase == "released":
        return ((f"released: {b.new} serves all of {b.model}", Tone.OK),)
    if b.phase == "blue":
        return ((f"{b.old} serves {b.model}; the green set ({b.new}) waits for w", Tone.NORMAL),)
    if b.in_flight == 0:
        return (("blue set: ", Tone.DIM), ("empty: r releases it", Tone.OK))
    return (("blue set: ", Tone.DIM), (f"{b.in_flight} in flight", Tone.WARN))


def canary_request_lines(body: Mapping[str, Any]) -> list[Line]:
    """What a canary start asks for (the admin API's ``canary``), each value the form left
    empty named as the router's choice."""
    settings = body.get("settings") or {}
    rules = settings.get("canary") or {}
    steps = rules.get("steps")
    steps_text = "the fleet file's" if steps is None else " → ".join(f"{p:g}%" for p in steps)
    dwell, window = rules.get("dwell_s"), rules.get("window_s")
    updater = (settings.get("updater") or {}).get("command", {}).get("run")
    replicas = body.get("replicas")
    rows = (
        ("replicas", "those that run it already" if not replicas else ", ".join(replicas)),
        ("stable name", body.get("model") or "the replicas' model"),
        ("share", "moved by you (s), from 0%" if body.get("manual") else f"steps {steps_text}"),
        ("each step", "the fleet file's dwell" if dwell is None else f"held {dwell:g} s"),
        ("judged over", "the fleet file's window" if window is None else f"{window:g} s"),
        ("floor", "the fleet file's" if "floor" not in settings else pct(settings["floor"])),
        ("updater", updater or "the fleet file's rollout.updater"),
    )
    lines: list[Line] = [((f"{k:<12}", Tone.DIM), (str(v), Tone.NORMAL)) for k, v in rows]
    lines.append(())
    lines.append(
        (
            (
                "The split holds the new version at 0% while the updater moves its replicas; "
                "the router rolls it back on its own when it does worse.",
                Tone.DIM,
            ),
        )
    )
    return lines


STEERING = {
    "step": "the new version gets {percent} of the stable name's requests from the next pick",
    "promote": "the split ends on the new version; the updater rolls the rest of the model to it",
    "abort": "the split goes back to 0% now; the canary replicas are moved back to the old version",
    "switch": "every request of the model goes to the green set; the blue set is drained",
    "switch back": "the blue set is readmitted and takes the model's requests again",
    "release": "the split ends; the blue set stays drained for its owner to shut down",
}
"""What each split action does, as its confirmation says it."""


def steering_lines(state: SplitState, action: str, percent: float | None = None) -> list[Line]:
    """The split as it stands, then what ``action`` does (with the share a step sets)."""
    if isinstance(state, CanaryState):
        now = f"{state.id}: {state.new} {pct(state.share)} of {state.model}, {state.phase}."
    else:
        now = (
            f"{state.id}: {state.model} {state.phase}; {state.in_flight} in flight on the blue set."
        )
    does = STEERING[action].format(percent="that share" if percent is None else f"{percent:g}%")
    return [((now, Tone.NORMAL),), ((does[0].upper() + does[1:] + ".", Tone.NORMAL),)]
