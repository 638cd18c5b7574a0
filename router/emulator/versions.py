"""Version switches: an emulated replica restarted onto another served model name.

A real update restarts the engine: ``systemctl restart vllm@x`` stops the process (every open
connection is cut, every request in it is lost) and starts one that loads the new weights
before it serves. vLLM binds its port before it builds the engine but calls ``listen()`` only
when its HTTP server starts, once the model is loaded, so for the whole load a connection is
*refused*: it is not a 503 from a live server. The emulator does the same: the listener
closes and open connections drop at once, and it listens again, naming the new version on
``/v1/models`` and serving requests for it, after ``load_s`` (emulated seconds, scaled by the
emulator's ``time_scale`` like every step of the engine).

The version is the served model name (vLLM's ``--served-model-name``), which is what the
router routes by; the performance model stays the one the fleet file declares (new weights of
the same architecture on the same card).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router.errors import ControlError
from router.rollout.templates import VERSION_NAME

__all__ = ["DEFAULT_LOAD_S", "VERSION_NAME", "VersionSwitch", "parse_version_switch"]

DEFAULT_LOAD_S = 5.0
"""Emulated seconds a restart takes to load its model when the command names none: the
order of a small model from a local disk; a 70B model from network storage takes minutes."""


@dataclass(frozen=True, slots=True)
class VersionSwitch:
    """Restart a replica onto ``version``, taking ``load_s`` (emulated) seconds to load it."""

    version: str
    load_s: float = DEFAULT_LOAD_S
    aliases: tuple[str, ...] = ()
    """More names to serve it under, as ``--served-model-name m-v2 m`` does: a stable name
    clients keep asking for while the version behind it changes."""


def parse_version_switch(body: object, default_load_s: float = DEFAULT_LOAD_S) -> VersionSwitch:
    """``{"version": "m-v2", "load_s": 2.0, "aliases": ["m"]}``; ControlError naming what is
    wrong."""
    if not isinstance(body, dict):
        raise ControlError("expected a JSON object with a 'version'")
    unknown = sorted(set(body) - {"version", "load_s", "aliases"})
    if unknown:
        expected = "'version', 'load_s' and 'aliases'"
        raise ControlError(f"unexpected key {unknown[0]!r}; expected {expected}")
    version = body.get("version")
    if not isinstance(version, str) or not VERSION_NAME.match(version):
        example = "'org/model-v2'"
        raise ControlError(f"'version' must be a model name such as {example}; got {version!r}")
    load_s = body.get("load_s", default_load_s)
    if isinstance(load_s, bool) or not isinstance(load_s, int | float):
        raise ControlError("'load_s' must be a number of seconds")
    if not (math.isfinite(load_s) and load_s >= 0):
        raise ControlError(f"'load_s' must be a finite number >= 0, got {load_s}")
    aliases = body.get("aliases", [])
    if not isinstance(aliases, list) or not all(
        isinstance(a, str) and VERSION_NAME.match(a) for a in aliases
    ):
        raise ControlError("'aliases' must be a list of model names")
    return VersionSwitch(
        version, float(load_s), tuple(dict.fromkeys(a for a in aliases if a != version))
    )
