"""Writing scenario files for tests, and running ``gpurouter run`` on them in-process."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.cli import main

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "examples" / "fleets" / "mixed-a100-v100.yaml"
EXAMPLES = ROOT / "examples" / "scenarios"


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]

    @property
    def summary(self) -> dict[str, Any]:
        last = self.lines[-1]
        assert last["kind"] == "summary"
        return last


def run_cli(*args: str) -> Run:
    """``gpurouter run ARGS`` with its output captured."""
    import contextlib

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", *args])
    return Run(code, out.getvalue(), err.getvalue())


def scenario_file(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    """A scenario file in ``tmp_path``; ``FLEET`` in ``text`` becomes the mixed example fleet."""
    path = tmp_path / name
    path.write_text(text.replace("FLEET", str(MIXED)), encoding="utf-8")
    return path
