"""The routing core stays UI-free: importing it never loads textual, rich or the console."""

from __future__ import annotations

import subprocess
import sys

HEADLESS_MODULES = [
    "router",
    "router.core",
    "router.control",
    "router.snapshot",
    "router.strategies",
    "router.config",
    "router.demo.lab_child",  # the demo's lab process: a fleet and its clients, no UI
    "router.demo.router_child",  # the demo's router process, no UI
]


def test_importing_the_core_loads_no_ui_library() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {HEADLESS_MODULES!r}: importlib.import_module(m)\n"
        "ui = ('textual', 'rich', 'console')\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ui)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
