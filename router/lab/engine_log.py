"""The one useful line of a failed engine's log.

A vLLM that fails to start prints a long traceback, often two (the engine core's, then the API
server's "see root cause above"). The line to show is the root cause: the last exception line
that is not only a pointer to another one.
"""

from __future__ import annotations

import re

__all__ = ["error_line"]

_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit)\b:?.*")
_POINTERS = ("see root cause above", "engine core initialization failed")
_PREFIX = re.compile(r"^\([^)]*\)\s*")
"""vLLM prefixes each line with its process, e.g. ``(EngineCore_DP0 pid=1234)``."""


def error_line(log: str) -> str:
    """The root-cause line of ``log``, else its last non-empty line, else a note it is empty."""
    lines = [_PREFIX.sub("", line).strip() for line in log.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return "(the engine printed nothing)"
    exceptions = [line for line in lines if _EXCEPTION.match(line)]
    for line in reversed(exceptions):
        if not any(pointer in line.lower() for pointer in _POINTERS):
            return line
    return exceptions[-1] if exceptions else lines[-1]
