"""Published measurements next to the model's predictions (``calibration.yaml``).

The rows are data; this module predicts each one, renders the table docs/performance-model.md
holds, and refits the efficiency factors. bench/calibrate.py is its command line.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.errors import ConfigError, Problem
from router.perf._yaml import FILE_KEY, LineMap, read_yaml
from router.perf.model import (
    DEFAULT_EFFICIENCY,
    Deployment,
    Efficiency,
    RunningSequence,
    decode_step_seconds,
    prefill_seconds,
    step_seconds,
)
from router.perf.profiles import ProfileCatalog, default_catalog

__all__ = [
    "CALIBRATION_FILE",
    "DEFAULT_TOLERANCE",
    "CalibrationRow",
    "calibration_table",
    "fit_efficiency",
    "load_calibration",
    "predict",
    "relative_error",
]

CALIBRATION_FILE = Path(__file__).with_name("calibration.yaml")
DEFAULT_TOLERANCE = 0.30
"""Largest |relative error| a row may show unless it says why it needs more."""

METRICS = {
    "tpot_ms": ("batch", "context_tokens"),
    "ttft_ms": ("prompt_tokens",),
    "static_batch_output_tokens_s": ("batch", "prompt_tokens", "output_tokens"),
}
"""Each metric and the workload fields it needs."""


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One published measurement and the conditions it was taken under."""

    id: str
    gpu: str
    model: str
    metric: str
    measured: float
    source: str
    url: str
    reported: str
    engine: str
    conditions: str
    tensor_parallel: int = 1
    batch: int = 1
    context_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    tolerance: float = DEFAULT_TOLERANCE
    why: str = ""


_TEXT = ("id", "gpu", "model", "metric", "source", "url", "reported", "engine", "conditions")
_INTS = ("tensor_parallel", "batch", "context_tokens", "prompt_tokens", "output_tokens")


def load_calibration(path: Path = CALIBRATION_FILE) -> list[CalibrationRow]:
    """The rows of a calibration file; a ConfigError listing every problem otherwise."""
    data = read_yaml(path)
    rows = data.get("rows") if isinstance(data, LineMap) else None
    if not isinstance(rows, list):
        raise ConfigError([Problem(str(path), None, FILE_KEY, "must hold a list under rows:")])
    problems: list[Problem] = []
    parsed = [_row(str(path), i, raw, problems) for i, raw in enumerate(rows)]
    if problems:
        raise ConfigError(problems)
    return [row for row in parsed if row is not None]


def _row(source: str, index: int, raw: Any, problems: list[Problem]) -> CalibrationRow | None:
    where = f"rows[{index}]"
    if not isinstance(raw, LineMap):
        problems.append(Problem(source, None, where, "must be a mapping"))
        return None
    found = [
        Problem(source, raw.key_lines.get(key, raw.line), f"{where}.{key}", message)
        for key, message in _row_problems(raw)
    ]
    problems.extend(found)
    return None if found else CalibrationRow(**raw)


def _row_problems(raw: LineMap) -> Iterator[tuple[str, str]]:
    known = set(CalibrationRow.__dataclass_fields__)
    for key in raw:
        if key not in known:
            yield str(key), "unknown key"
    for key in (*_TEXT, "measured"):
        if key not in raw:
            yield key, "missing"
    for key in (*_TEXT, "why"):
        if key in raw and not isinstance(raw[key], str):
            yield key, "must be a string"
    for key in _INTS:
        value = raw.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            yield key, "must be a whole number >= 0"
    for key in ("measured", "tolerance"):
        value = raw.get(key, 1.0)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            yield key, "must be a number > 0"
    if raw.get("metric") not in METRICS:
        yield "metric", f"must be one of {', '.join(METRICS)}"
    else:
        for key in METRICS[raw["metric"]]:
            if not raw.get(key):
                yield key, f"needed by metric {raw['metric']}"
    tolerance = raw.get("tolerance", DEFAULT_TOLERANCE)
    wide = isinstance(tolerance, int | float) and tolerance > DEFAULT_TOLERANCE
    if wide and not raw.get("why"):
        yield "why", f"a tolerance above {DEFAULT_TOLERANCE} needs a reason"


def predict(
    row: CalibrationRow,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    catalog: ProfileCatalog | None = None,
) -> float:
    """The model's figure for ``row``, in the row's unit."""
    catalog = catalog or default_catalog()
    deployment = Deployment(
        catalog.gpu(row.gpu), catalog.model(row.model), row.tensor_parallel, efficiency=efficiency
    )
    if row.metric == "tpot_ms":
        return 1000 * decode_step_seconds(deployment, row.batch, row.context_tokens)
    if row.metric == "ttft_ms":
        return 1000 * prefill_seconds(deployment, row.prompt_tokens)
    return _static_batch_tokens_per_s(deployment, row)


def _static_batch_tokens_per_s(deployment: Deployment, row: CalibrationRow) -> float:
    """One step prefills every prompt; output_tokens - 1 decode steps follow (the first
    token comes from the prefill), at a mean context of prompt + output / 2."""
    prefill = step_seconds(deployment, [RunningSequence(0, row.prompt_tokens)] * row.batch)
    mean_context = row.prompt_tokens + row.output_tokens / 2
    decode = decode_step_seconds(deployment, row.batch, mean_context)
    total = prefill + (row.output_tokens - 1) * decode
    return row.batch * row.output_tokens / total


def relative_error(
    row: CalibrationRow,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    catalog: ProfileCatalog | None = None,
) -> float:
    """(predicted - measured) / measured for ``row``."""
    return predict(row, efficiency, catalog) / row.measured - 1


_UNITS = {"tpot_ms": "ms/token", "ttft_ms": "ms TTFT", "static_batch_output_tokens_s": "tok/s"}


def calibration_table(
    rows: Sequence[CalibrationRow], efficiency: Efficiency = DEFAULT_EFFICIENCY
) -> str:
    """The Markdown table of measurements, predictions and errors."""
    lines = [
        "| # | GPU | model | TP | batch | tokens (in/ctx, out) | metric | measured | model "
        "| error | engine | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for number, row in enumerate(rows, start=1):
        predicted = predict(row, efficiency)
        error = predicted / row.measured - 1
        lines.append(
            f"| {number} | {row.gpu} | {row.model} | {row.tensor_parallel} | {row.batch} "
            f"| {_tokens(row)} | {_UNITS[row.metric]} | {row.measured:g} | {predicted:.4g} "
            f"| {error:+.0%} | {row.engine} | [{row.source}]({row.url}) |"
        )
    return "\n".join(lines)


def _tokens(row: CalibrationRow) -> str:
    if row.metric == "tpot_ms":
        return f"ctx {row.context_tokens}"
    if row.metric == "ttft_ms":
        return f"{row.prompt_tokens} in"
    return f"{row.prompt_tokens} in, {row.output_tokens} out"


def _grid(low: float, high: float, step: float) -> list[float]:
    return [round(low + i * step, 4) for i in range(round((high - low) / step) + 1)]


def fit_efficiency(rows: Iterable[CalibrationRow], step: float = 0.05) -> tuple[Efficiency, float]:
    """The efficiencies minimizing the mean squared log error over ``rows``, and that error.

    A grid search: mfu and bandwidth first on the single-GPU rows, then the tensor-parallel
    factor on the multi-GPU rows with those two fixed. Rows that needed a wider tolerance
    measure something the model leaves out (they say why), so they are not fitted.
    """
    rows = [r for r in rows if r.tolerance <= DEFAULT_TOLERANCE]
    single = [r for r in rows if r.tensor_parallel == 1]
    multi = [r for r in rows if r.tensor_parallel > 1] or rows
    pairs = itertools.product(_grid(0.3, 1.0, step), _grid(0.4, 1.0, step))
    mfu, bandwidth = min(
        pairs,
        key=lambda p: _loss(single, Efficiency(p[0], p[1], DEFAULT_EFFICIENCY.tensor_parallel)),
    )
    tp = min(_grid(0.5, 1.0, step), key=lambda t: _loss(multi, Efficiency(mfu, bandwidth, t)))
    best = Efficiency(mfu, bandwidth, tp)
    return best, _loss(rows, best)


def _loss(rows: Sequence[CalibrationRow], efficiency: Efficiency) -> float:
    return sum(math.log(predict(r, efficiency) / r.measured) ** 2 for r in rows) / len(rows)
