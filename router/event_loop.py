"""Run a process's main coroutine on uvloop where it is installed (the headless router's
loop: ``gpurouter serve``, its workers and its supervisor)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["run_loop"]


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:  # not on Windows: the default loop serves too, a little slower
        asyncio.run(main)
    else:
        uvloop.run(main)
