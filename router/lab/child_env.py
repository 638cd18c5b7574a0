"""The environment of the lab's child processes (builds, tokenizer training, engines)."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["child_env"]

_LEAKS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without what would point a child at gpurouter's own Python
    (the lab's environments are separate), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _LEAKS}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra or {})
    return env
