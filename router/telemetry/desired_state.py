"""The operator's last applied desired state, kept on disk by each router.

A broker that crashes without persistence loses its retained messages, and with them the
desired state: a router started afterwards would run the fleet file's settings. So each
:class:`~router.telemetry.control_topics.ControlLink` writes every desired-state message it
applies to a small JSON file, and applies the file's messages when it starts, before any
from the broker (a newer retained message then replaces one of them as usual)::

    {"v": 1, "cluster": "prod", "slots": {"<slot>": <the message as received, sig included>}}

The file is replaced atomically (a temporary file beside it, flushed to disk, renamed over
it), so a crash while writing leaves the old state or the new one, never half of either.
Messages read back go through the checks of messages received (the signature included), so
editing the file is no way around them.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from router.config.schema import FleetConfig
from router.errors import ControlError

__all__ = ["DesiredStateFile", "default_state_path", "state_path"]

STATE_VERSION = 1
MAX_STATE_BYTES = 1024 * 1024
"""A state file holds a few hundred bytes per slot; a larger one is not ours."""


def default_state_path(cluster: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/gpurouter/control/<cluster>.json``, ``~/.local/state`` when unset."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "gpurouter" / "control" / f"{cluster}.json"


def state_path(fleet: FleetConfig, environ: Mapping[str, str] | None = None) -> Path:
    """Where the fleet's routers keep their desired state: ``control.state_file`` (relative
    to the fleet file), or the default."""
    configured = fleet.control.state_file
    if configured is None:
        return default_state_path(fleet.cluster, environ)
    path = Path(configured).expanduser()
    if not path.is_absolute() and fleet.source is not None:
        path = fleet.source.parent / path
    return path


class DesiredStateFile:
    """One router's saved desired state: the last applied message of each slot."""

    def __init__(self, path: Path, cluster: str) -> None:
        self.path = path
        self.cluster = cluster

    def load(self) -> dict[str, dict[str, Any]]:
        """The saved messages by slot; empty when there is no file. ControlError when the
        file cannot be read or is not the state of this cluster."""
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ControlError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_STATE_BYTES:
            raise ControlError(f"{self.path}: over {MAX_STATE_BYTES} bytes, not a state file")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ControlError(f"{self.path}: not JSON") from None
        return self._slots(data)

    def _slots(self, data: object) -> dict[str, dict[str, Any]]:
        if not isinstance(data, dict) or data.get("v") != STATE_VERSION:
            raise ControlError(f"{self.path}: expected an object with v {STATE_VERSION}")
        if data.get("cluster") != self.cluster:
            raise ControlError(f"{self.path}: the state of cluster {data.get('cluster')!r}")
        slots = data.get("slots")
        if not isinstance(slots, dict) or not all(
            isinstance(slot, str) and isinstance(message, dict) for slot, message in slots.items()
        ):
            raise ControlError(f"{self.path}: slots must map each slot to a message object")
        return slots

    def save(self, messages: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace the file with ``messages``, atomically; OSError when it cannot be."""
        slots = dict(sorted(messages.items()))
        body = {"v": STATE_VERSION, "cluster": self.cluster, "slots": slots}
        data = json.dumps(body, indent=1).encode("utf-8")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _sync_directory(self.path.parent)


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); where a directory cannot be opened, the
    rename stands as the file system keeps it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
