"""Build, once, the virtual environment an engine kind runs in, and find it again.

The environment is built under a temporary name beside its final place and renamed into place
only once every step passed and its marker is written, so a failed or interrupted build never
looks complete: an interrupted one leaves a ``.NAME.partial-PID`` directory, removed by the next
build. Builds of one kind take a lock, so two commands never build the same one at once.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from router.lab.child_env import child_env
from router.lab.engine_kind import EngineKind
from router.lab.errors import EnvironmentBuildError
from router.lab.locks import locked

__all__ = ["LAUNCHER", "MARKER", "LabEnvironment", "ensure_environment", "find_environment"]

MARKER = "gpurouter-lab.json"
"""Written last: its presence, with the kind's recipe, is what makes an environment complete."""
LAUNCHER = "launch.py"
"""The script engines are started with, inside the environment."""
_TAIL_LINES = 15


@dataclass(frozen=True, slots=True)
class LabEnvironment:
    """A complete environment of one engine kind."""

    kind: EngineKind
    root: Path
    built_s: float
    """How long its build took."""
    version: str
    """What the engine printed for its version check."""

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def launcher(self) -> Path:
        return self.root / LAUNCHER


def find_environment(home: Path, kind: EngineKind) -> LabEnvironment | None:
    """The complete environment of ``kind`` under ``home``, if one was built with its recipe."""
    root = home / kind.name
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("recipe") != kind.recipe:
        return None
    return LabEnvironment(kind, root, float(marker["built_s"]), str(marker["version"]))


def ensure_environment(
    kind: EngineKind,
    home: Path,
    *,
    python: str = sys.executable,
    rebuild: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> LabEnvironment:
    """The environment of ``kind``, built first if there is none (or ``rebuild``).

    ``python`` makes the virtual environment (any Python 3.11+). EnvironmentBuildError says
    which command failed, with its last lines, and how to retry; nothing half-built is kept.
    """
    home.mkdir(parents=True, exist_ok=True)
    with locked(home / f".{kind.name}.lock"):
        found = None if rebuild else find_environment(home, kind)
        if found is not None:
            return found
        return _build(kind, home, python, say)


def _build(kind: EngineKind, home: Path, python: str, say: Callable[[str], None]) -> LabEnvironment:
    # Under the lock, any partial directory is from a build that died: clear it.
    for stale in home.glob(f".{kind.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    partial = home / f".{kind.name}.partial-{os.getpid()}"
    log = home / f"{kind.name}-build.log"
    log.write_text("")
    started = time.monotonic()
    try:
        version = _install(kind, partial, python, log, say)
        built_s = time.monotonic() - started
        marker = {"recipe": kind.recipe, "built_s": round(built_s, 1), "version": version}
        (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        target = home / kind.name
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    except BaseException:
        # Failed, interrupted or killed by an exception: nothing half-built stays.
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return LabEnvironment(kind, target, built_s, version)


def _install(
    kind: EngineKind, root: Path, python: str, log: Path, say: Callable[[str], None]
) -> str:
    """Every build step in ``root``; returns the engine's version line."""
    venv_python = str(root / "bin" / "python")
    pip = [venv_python, "-m", "pip"]
    say(f"creating the {kind.name} environment")
    _step([python, "-m", "venv", str(root)], kind, log)
    if kind.packages:
        say(f"installing {' '.join(kind.packages)} (a few minutes the first time)")
        _step([*pip, "install", *kind.pip_options, *kind.packages], kind, log)
    if kind.remove_after:
        _step([*pip, "uninstall", "--yes", *kind.remove_after], kind, log)
    (root / LAUNCHER).write_text(kind.launcher)
    if not kind.check:
        return ""
    say(f"checking that {kind.name} starts")
    lines = _step([venv_python, str(root / LAUNCHER), *kind.check], kind, log)
    return lines[-1].strip() if lines else ""


def _step(argv: list[str], kind: EngineKind, log: Path) -> list[str]:
    """Run one build command, appending its output to ``log``; its output lines."""
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        start = out.tell()
        code = subprocess.call(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env()
        )
    with log.open() as text:
        text.seek(start)
        lines = [line.rstrip("\n") for line in text if line.strip()]
    if code != 0:
        raise EnvironmentBuildError(_failure(kind, argv, code, lines, log))
    return lines


def _failure(kind: EngineKind, argv: list[str], code: int, lines: list[str], log: Path) -> str:
    tail = "\n".join(f"  {line}" for line in lines[-_TAIL_LINES:]) or "  (no output)"
    return (
        f"building the {kind.name} lab environment failed (exit {code}) at:\n"
        f"  {shlex.join(argv)}\n"
        f"its last lines:\n{tail}\n"
        f"nothing half-built was kept (whole log: {log}); "
        f"retry with: gpurouter lab {kind.name} build"
    )
