"""The lab's process mechanics, on a stand-in process tree (tests/lab_standin.py): each engine
in a session of its own, ``down`` stopping exactly those sessions, freeze and crash of the
compute process, and a failed start that says why and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.lab import EngineStartError, Lab, LabEnvironment, LabError, free_port, wait_ready
from router.lab.processes import read_process, session_members
from router.lab.state import load_state
from tests.lab_standin import (
    CORE_TITLE,
    READY_S,
    standin_engine,
    standin_environment,
    standin_lab,
)


@pytest.fixture
def environment(tmp_path: Path) -> LabEnvironment:
    return standin_environment(tmp_path / "standin")


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not the lab's: nothing the lab does may end it."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield process
    process.kill()
    process.wait()


def _alive(pid: int) -> bool:
    info = read_process(pid)
    return info is not None and info.state != "Z"


def test_each_engine_runs_in_its_own_session_with_its_core_process(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 2)
    try:
        sessions = {engine.record.pid for engine in lab.engines}
        assert len(sessions) == 2
        for engine in lab.engines:
            members = engine.members()
            assert {p.session for p in members} == {engine.record.pid}
            assert engine.core_process().title.startswith(CORE_TITLE)
            assert engine.healthy()
    finally:
        lab.down()


def test_down_stops_exactly_the_recorded_sessions(
    environment: LabEnvironment, tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """``down`` finds the lab from its state file alone, as another command would, stops every
    process of its engines (the core processes too) and nothing else."""
    lab = standin_lab(environment, tmp_path, 2)
    processes = [p.pid for engine in lab.engines for p in engine.members()]
    assert len(processes) == 4

    attached = Lab.attach(environment.kind, tmp_path, tmp_path)
    assert attached is not None
    stopped = attached.down()

    assert sorted(e.name for e in stopped) == ["s-0", "s-1"]
    assert all(engine.members() == [] for engine in lab.engines)
    assert [pid for pid in processes if _alive(pid)] == []
    assert bystander.poll() is None
    assert load_state(tmp_path) is None


def test_a_reused_pid_is_not_taken_for_an_engine(bystander: subprocess.Popen[bytes]) -> None:
    """A recorded engine whose pid now belongs to a process started at another time has no
    members: ``down`` leaves that process alone."""
    info = read_process(bystander.pid)
    assert info is not None
    assert session_members(info.session, None)  # the session exists...
    assert session_members(bystander.pid, info.start_ticks + 1) == []  # ...but not as recorded


def test_freeze_stops_only_the_core_process_and_health_still_answers(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 1)
    engine = lab.engines[0]
    try:
        engine.freeze()
        states = {p.title.startswith(CORE_TITLE): p.state for p in engine.members()}
        assert states[True] == "T"
        assert states[False] != "T"
        assert engine.healthy()
        engine.thaw()
        assert all(p.state != "T" for p in engine.members())
    finally:
        lab.down()


def test_kill_core_leaves_the_api_server_running(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 1)
    engine = lab.engines[0]
    try:
        core = engine.core_process().pid
        engine.kill_core()
        while _alive(core):
            pass
        assert engine.running()
        assert [p.title for p in engine.members() if p.title.startswith(CORE_TITLE)] == []
    finally:
        lab.down()


def test_an_engine_that_fails_at_start_says_why_and_nothing_is_left_running(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    good = standin_engine(environment, "good", free_port(), tmp_path)
    bad = standin_engine(environment, "bad", 0, tmp_path)  # port 0: the stand-in fails
    good.start()
    bad.start()
    with pytest.raises(EngineStartError) as failure:
        wait_ready([good, bad], READY_S)
    message = str(failure.value)
    assert "engine bad (port 0, core 0) exited before it was ready" in message
    assert "ValueError: the stand-in was told to fail" in message
    assert str(bad.log) in message
    assert good.members() == []
    assert bad.members() == []


def test_restart_brings_a_terminated_engine_back_on_its_port(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 1)
    engine = lab.engines[0]
    try:
        first = engine.record.pid
        engine.terminate()
        engine.restart(READY_S)
        assert engine.record.pid != first
        assert engine.healthy()
    finally:
        lab.down()


def test_ensure_ready_thaws_a_frozen_engine_and_restarts_a_dead_one(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 2)
    frozen, dead = lab.engines
    try:
        frozen.freeze()
        dead.stop()
        lab.ensure_ready(READY_S)
        assert all(p.state != "T" for p in frozen.members())
        assert dead.running()
        assert dead.healthy()
        # The restarted engine's new session is what the state file now records.
        recorded = load_state(tmp_path)
        assert recorded is not None
        assert recorded.engines[1].pid == dead.record.pid
    finally:
        lab.down()


def test_up_refuses_to_start_over_a_running_lab(
    environment: LabEnvironment, tmp_path: Path
) -> None:
    lab = standin_lab(environment, tmp_path, 1)
    try:
        with pytest.raises(LabError, match=r"a standin lab is already up \(1 engine\(s\)\)"):
            Lab.up(environment.kind, tmp_path / "home", run_dir=tmp_path)
        assert lab.engines[0].running()
    finally:
        lab.down()
