"""Ctrl+C on the command line: one line saying so, what was done so far, exit 130, and never a
traceback (``gpurouter sim``'s own case is in test_sim_cli.py)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gpurouter(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "console.cli", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    os.mkfifo(path)
    return path


def writer_once_read(path: Path) -> int:
    """Open the FIFO for writing as soon as a reader has it open (then its read blocks)."""
    while True:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        time.sleep(0.01)  # polling: a FIFO gives no event for a reader that opened it


def test_a_command_without_a_report_of_its_own_says_interrupted_and_exits_130(
    fifo: Path,
) -> None:
    """`config check` blocked reading its file: Ctrl+C ends it in one line, no traceback."""
    with gpurouter("config", "check", str(fifo)) as proc:
        fd = writer_once_read(fifo)
        try:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            os.close(fd)
    assert (proc.returncode, out, err) == (130, "", "gpurouter config: interrupted\n")
