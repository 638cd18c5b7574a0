"""What a running lab needs to be found again by ``status`` and stopped by ``down``:
``state.json`` in the lab's run directory, rewritten whenever an engine is added."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.lab.engine_kind import ServeOptions
from router.lab.engines import EngineRecord
from router.lab.errors import LabError

__all__ = ["STATE_FILE", "LabState", "load_state", "save_state"]

STATE_FILE = "state.json"


@dataclass(slots=True)
class LabState:
    """One lab: which engine kind, how its engines serve, each engine, its fleet file."""

    kind: str
    options: ServeOptions
    fleet_file: str
    engines: list[EngineRecord] = field(default_factory=list)


def save_state(run_dir: Path, state: LabState) -> None:
    """Write the state (atomically: a reader never sees half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    document = {
        "kind": state.kind,
        "options": dataclasses.asdict(state.options),
        "fleet_file": state.fleet_file,
        "engines": [dataclasses.asdict(e) for e in state.engines],
    }
    partial = run_dir / f".{STATE_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(document, indent=2) + "\n")
    partial.replace(run_dir / STATE_FILE)


def load_state(run_dir: Path) -> LabState | None:
    """The state in ``run_dir``, or None when no lab was brought up there."""
    path = run_dir / STATE_FILE
    try:
        document: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read the lab's state {path}: {exc}") from None
    try:
        return LabState(
            kind=document["kind"],
            options=_options(document["options"]),
            fleet_file=document["fleet_file"],
            engines=[EngineRecord(**e) for e in document["engines"]],
        )
    except (KeyError, TypeError) as exc:
        raise LabError(f"the lab's state {path} is not one gpurouter wrote: {exc}") from None


def _options(recorded: dict[str, Any]) -> ServeOptions:
    # A lab brought up before the lab chose a format ran its engines in the models' bf16.
    return ServeOptions(**{"dtype": "bfloat16", **recorded})
