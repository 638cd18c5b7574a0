"""``gpurouter lab``: the engine is a parameter, bad arguments exit 2, and with no lab up,
``status`` says so (exit 1) and ``down`` has nothing to stop (exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.cli import main
from router.lab import HOME_ENV


@pytest.fixture(autouse=True)
def _lab_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))


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
    ],
)
def test_bad_arguments_exit_2_with_what_is_wrong(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert complaint in capsys.readouterr().err
