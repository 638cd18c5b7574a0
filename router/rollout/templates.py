"""Placeholders in update commands and requests: ``{replica}``, ``{node}``, ``{url}``,
``{version}``.

Only these four names between braces are placeholders; any other brace is text, so a JSON
body template (``{"version": "{version}"}``) needs no escaping. A ``{name}`` that looks like a
placeholder but is not one of them is refused when the fleet file is read: it is a typo that
would otherwise reach a replica as text.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping

__all__ = [
    "PLACEHOLDERS",
    "SAMPLE",
    "VERSION_NAME",
    "fill",
    "split_command",
    "template_problem",
]

PLACEHOLDERS = ("replica", "node", "url", "version")
VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*\Z")
"""What a version (a served model name) may be: Hugging Face names (``org/model``), tags
with dots and colons; nothing that needs quoting in a JSON string or an argument."""
_LOOKS_LIKE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SAMPLE: Mapping[str, str] = {
    "replica": "replica-0",
    "node": "node-0",
    "url": "http://127.0.0.1:8000",
    "version": "org/model-v2",
}
"""Values a template is tried with when it is checked (a URL must still be a URL)."""


def template_problem(text: str) -> str | None:
    """What is wrong with the template's placeholders, or None."""
    unknown = [name for name in _LOOKS_LIKE.findall(text) if name not in PLACEHOLDERS]
    if unknown:
        known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
        return f"unknown placeholder {{{unknown[0]}}}; the placeholders are {known}"
    return None


def fill(text: str, values: Mapping[str, str], encode: Callable[[str], str] = str) -> str:
    """``text`` with each placeholder replaced by ``encode(values[name])``."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return encode(values[name]) if name in PLACEHOLDERS else match.group(0)

    return _LOOKS_LIKE.sub(one, text)


def split_command(text: str) -> list[str]:
    """The command line's arguments, split as a POSIX shell splits words (no expansion);
    ValueError for an unclosed quote, or an empty line."""
    words = shlex.split(text)
    if not words:
        raise ValueError("the command is empty")
    return words
