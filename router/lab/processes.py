"""Process trees read from /proc: which processes belong to an engine's session, and which
one is its compute core. Linux only, as the lab is (it pins engines with ``taskset``).

An engine is started as the leader of a new session, so its session id is the leader's pid
and every process it forks carries it. Linux never hands out a pid still in use as a session
id, so while any member lives the id is ours; a live leader whose start time differs from the
recorded one is someone else's process and is left alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessInfo", "read_process", "session_members", "signal_processes"]

_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """What /proc says of one process."""

    pid: int
    state: str
    """One letter: R running, S sleeping, T stopped, Z zombie, ..."""
    session: int
    start_ticks: int
    """Start time in clock ticks after boot: with the pid, it names a process uniquely."""
    title: str
    """Its command line, or the title it gave itself (vLLM's ``VLLM::EngineCore``)."""


def read_process(pid: int) -> ProcessInfo | None:
    """The process ``pid``, or None when there is none (or it is gone meanwhile)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        cmdline = (_PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name in parentheses may itself hold spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    title = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return ProcessInfo(pid, fields[0], int(fields[3]), int(fields[19]), title)


def session_members(session: int, leader_ticks: int | None) -> list[ProcessInfo]:
    """The live processes of ``session`` (zombies left out); none if its leader is alive but
    started at another time than ``leader_ticks`` (the pid was reused)."""
    leader = read_process(session)
    if leader is not None and leader_ticks is not None and leader.start_ticks != leader_ticks:
        return []
    members = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            info = read_process(int(entry.name))
            if info is not None and info.session == session and info.state != "Z":
                members.append(info)
    return members


def signal_processes(processes: list[ProcessInfo], sig: signal.Signals) -> None:
    """Send ``sig`` to each process; one that is gone meanwhile is skipped."""
    for info in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, sig)
