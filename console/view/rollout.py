"""A rollout as lines of cells: the plan before it starts, its progress while it runs.

Pure functions of :mod:`console.rollout.model`'s types, so the confirmation and the progress
screen are tested without a terminal; the words carry the meaning, the tones only colour it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from console.rollout.model import Figures, RolloutPreview, RolloutProgress
from console.view.format import Cell, Tone, pct

__all__ = ["Line", "plan_lines", "prediction_lines", "progress_lines", "settings_line"]

Line = tuple[Cell, ...]

_PHASE_TONES = {
    "done": Tone.OK,
    "rolled back": Tone.OK,
    "failed": Tone.BAD,
    "rollback failed": Tone.BAD,
    "aborted": Tone.WARN,
    "paused": Tone.WARN,
}
_STEP_TONES = {
    "updated": Tone.OK,
    "rolled back": Tone.OK,
    "flagged": Tone.BAD,
    "kept": Tone.WARN,
    "pending": Tone.DIM,
}


def settings_line(settings: Mapping[str, Any]) -> Line:
    """``floor 75% · weakest-first · drain 300 s, then wait · ready 900 s``."""
    order = settings.get("order")
    order_text = ", ".join(order) if isinstance(order, list) else str(order)
    text = (
        f"floor {pct(float(settings['floor']))} · {order_text} · "
        f"drain {float(settings['drain_timeout_s']):g} s, then {settings['on_drain_timeout']} · "
        f"ready {float(settings['ready_timeout_s']):g} s"
    )
    return ((text, Tone.NORMAL),)


def plan_lines(preview: RolloutPreview) -> list[Line]:
    """The waves in order, each replica with its share of the fleet's capacity, and what
    stays in service while the wave is out, against the floor."""
    lines: list[Line] = [
        settings_line(preview.settings),
        ((f"updater {preview.settings.get('updater', 'none')}", Tone.DIM),),
        (),
    ]
    width = len(str(len(preview.waves)))
    for n, wave in enumerate(preview.waves, 1):
        out = ", ".join(f"{r} {pct(preview.shares.get(r, 0.0))}" for r in wave.replicas)
        lines.append(
            (
                (f"wave {n:>{width}}  ", Tone.DIM),
                (out, Tone.NORMAL),
                (f"  → in service {pct(wave.remaining)}", Tone.ACCENT),
            )
        )
    lowest = min((w.remaining for w in preview.waves), default=1.0)
    lines.append(())
    lines.append(
        (
            (f"{len(preview.waves)} waves; lowest in service {pct(lowest)}", Tone.NORMAL),
            (f" (floor {pct(preview.floor)})", Tone.DIM),
        )
    )
    return lines


def prediction_lines(preview: RolloutPreview) -> list[Line]:
    """The simulator's forecast (issue 16, point 5), or why there is none; no line when the
    router said neither: a figure shown here is one the simulator computed, never a stand-in."""
    if preview.prediction is None:
        why = preview.prediction_error
        return [((why, Tone.DIM),)] if why else []
    return [(("predicted: ", Tone.DIM), (_figures_text(preview.prediction), Tone.NORMAL))]


def _figures_text(f: Figures) -> str:
    ttft = "-" if f.ttft_p99_s is None else f"{f.ttft_p99_s:.2f} s"
    took = "" if f.duration_s is None else f" · {f.duration_s:.0f} s"
    return (
        f"capacity at lowest {pct(f.capacity_lowest)} · peak queue {f.peak_queue} · "
        f"p99 TTFT {ttft}{took}"
    )


def _side_by_side(progress: RolloutProgress) -> list[Line]:
    """Predicted at the start and measured so far, one line each, in the same words."""
    out: list[Line] = []
    for label, figures in (
        ("predicted: ", progress.prediction),
        ("measured:  ", progress.measured),
    ):
        if figures is not None:
            out.append(((label, Tone.DIM), (_figures_text(figures), Tone.NORMAL)))
    return out


def progress_lines(progress: RolloutProgress) -> list[Line]:
    """Phase and wave, capacity now and at its lowest against the floor, requests moved and
    waited for, each replica's step and version, and the error that stopped it."""
    where = (
        "not started"
        if progress.wave is None
        else f"wave {progress.wave + 1} of {len(progress.waves)}"
    )
    under = progress.capacity_lowest < progress.floor - 1e-9
    lines: list[Line] = [
        (
            (f"{progress.id}: {progress.version} ", Tone.NORMAL),
            (progress.phase, _PHASE_TONES.get(progress.phase, Tone.ACCENT)),
            (f", {where}", Tone.NORMAL),
        ),
        (
            ("capacity in service ", Tone.DIM),
            (f"{pct(progress.capacity_now)} now", Tone.NORMAL),
            (", ", Tone.DIM),
            (f"{pct(progress.capacity_lowest)} at lowest", Tone.BAD if under else Tone.NORMAL),
            (f" (floor {pct(progress.floor)})", Tone.DIM),
        ),
        (
            (
                f"{progress.requests_moved} requests moved, {progress.waited_for} waited for",
                Tone.NORMAL,
            ),
        ),
        *_side_by_side(progress),
        (),
    ]
    width = max([len("REPLICA"), *(len(r.replica) for r in progress.replicas)])
    lines.append(((f"{'REPLICA':<{width}}  WAVE  {'STEP':<11}  VERSION", Tone.DIM),))
    for r in progress.replicas:
        lines.append(
            (
                (f"{r.replica:<{width}}  {r.wave:>4}  ", Tone.NORMAL),
                (f"{r.step:<11}", _STEP_TONES.get(r.step, Tone.ACCENT)),
                (f"  {r.version}", Tone.NORMAL),
            )
        )
    if progress.error:
        lines.extend(((), (("error: ", Tone.BAD), (progress.error, Tone.BAD))))
    return lines
