"""Where the lab keeps what it builds and runs: one directory outside any checkout.

``$GPUROUTER_LAB_HOME`` if set, else ``$XDG_CACHE_HOME/gpurouter/lab``, else
``~/.cache/gpurouter/lab``. Inside it: one virtual environment per engine kind (``vllm/``),
the tiny models (``models/``) and what a running lab needs to be stopped (``run/<kind>/``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["HOME_ENV", "lab_home"]

HOME_ENV = "GPUROUTER_LAB_HOME"
"""The environment variable that moves the lab's directory."""


def lab_home(environ: Mapping[str, str] | None = None) -> Path:
    """The lab's directory (not created here)."""
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]).expanduser()
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "gpurouter" / "lab"
