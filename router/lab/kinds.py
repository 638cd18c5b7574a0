"""The engines the lab knows, by their command-line name."""

from __future__ import annotations

from router.lab.engine_kind import EngineKind
from router.lab.errors import LabError
from router.lab.vllm import VLLM

__all__ = ["KINDS", "engine_kind"]

KINDS: dict[str, EngineKind] = {VLLM.name: VLLM}


def engine_kind(name: str) -> EngineKind:
    """The engine called ``name``; LabError naming the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise LabError(f"no lab engine called {name!r} (known: {', '.join(KINDS)})") from None
