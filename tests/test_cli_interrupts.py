"""Ctrl+C on the command line: one line saying so, what was done so far, exit 130, and never a
traceback (``gpurouter sim``'s own case is in test_sim_cli.py)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fleet_factory import TWO_CARD_YAML

ROOT = Path(__file__).resolve().parents[1]


# The child starts as from a shell: Ctrl+C at its default, whatever this test process
# inherited or left behind (a child keeps an ignored or blocked SIGINT across exec).
AS_FROM_A_SHELL = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT]); "
    "sys.argv[0] = 'gpurouter'; "
    "runpy.run_module('console.cli', run_name='__main__', alter_sys=True)"
)


def gpurouter(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", AS_FROM_A_SHELL, *argv],
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


def blocked_in_read(pid: int) -> None:
    """Wait (bounded) until the process sleeps in its read of the FIFO. A signal that lands
    between the interpreter's last check and the read system call is acted on only when the
    read returns (the interpreter's own race, not the command's): sent earlier, Ctrl+C hung
    the test about one time in six."""
    wchan = Path(f"/proc/{pid}/wchan")
    for _ in range(1000):
        if "pipe" in wchan.read_text():
            return
        time.sleep(0.01)  # polling: nothing signals that a process went to sleep
    raise AssertionError(f"never blocked reading the FIFO (last: {wchan.read_text()!r})")


def test_a_command_without_a_report_of_its_own_says_interrupted_and_exits_130(
    fifo: Path,
) -> None:
    """`config check` blocked reading its file: Ctrl+C ends it in one line, no traceback."""
    with gpurouter("config", "check", str(fifo)) as proc:
        fd = writer_once_read(fifo)
        try:
            blocked_in_read(proc.pid)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            os.close(fd)
            if proc.poll() is None:
                proc.kill()  # it ignored Ctrl+C: fail here rather than hang the suite
    assert (proc.returncode, out, err) == (130, "", "gpurouter config: interrupted\n")


SCENARIO = """\
name: long-drill
fleet: {{file: fleet.yaml, time_scale: {scale}}}
workload:
  phases:
    - {{duration: 3600, load: 0.5}}
checks:
  - {{metric: failed, max: 0}}
"""


def long_scenario(tmp_path: Path, scale: float) -> Path:
    (tmp_path / "fleet.yaml").write_text(TWO_CARD_YAML)
    path = tmp_path / "long.yaml"
    path.write_text(SCENARIO.format(scale=scale))
    return path


@pytest.mark.parametrize("mode", ["--simulate", "live"])
def test_run_interrupted_prints_the_partial_report_one_line_and_exits_130(
    tmp_path: Path, mode: str
) -> None:
    """Ctrl+C an hour-long drill after its first second: the samples so far, a summary of
    what ran (requests still running count as stopped, no check judged), one line on stderr."""
    argv = ["run", str(long_scenario(tmp_path, 10.0)), "--json"]
    with gpurouter(*argv, *([mode] if mode == "--simulate" else [])) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        # Through the same buffered files: communicate() would skip what readline read.
        rest, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=60)
    lines = [json.loads(line) for line in (first + rest).splitlines()]
    *samples, summary = lines
    assert proc.returncode == 130, err
    assert samples
    assert {line["kind"] for line in samples} == {"sample"}
    assert summary["kind"] == "summary"
    stopped_at = summary["interrupted_at"]
    assert samples[-1]["t"] <= stopped_at < 3600
    assert (summary["checks"], summary["judged"], summary["passed"]) == ([], False, False)
    assert "unfinished" not in summary
    assert summary["stopped"] >= 0
    verdict = f"interrupted at t={stopped_at:g} s of 3600 s: checks not judged"
    assert summary["verdict"] == verdict
    assert err == f"gpurouter run: {verdict}; the report above is what ran until then\n"
