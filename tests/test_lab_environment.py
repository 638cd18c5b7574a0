"""The lab's environment builder with a real venv and a real pip: a build that fails says
which command failed, with its last lines and how to retry, and leaves nothing that looks
complete; a complete build is found again and reused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from router.lab import (
    HOME_ENV,
    EngineKind,
    EnvironmentBuildError,
    ensure_environment,
    find_environment,
    lab_home,
)
from tests.lab_standin import standin_kind

MISSING = "gpurouter-lab-test-no-such-distribution"


def _kind(**changes: object) -> EngineKind:
    # --no-index: pip looks nowhere, so the test needs no network and fails the same way always.
    return dataclasses.replace(standin_kind(), pip_options=("--no-index",), **changes)  # type: ignore[arg-type]


def test_a_failed_install_names_the_command_its_output_and_the_retry(tmp_path: Path) -> None:
    kind = _kind(packages=(MISSING,))
    with pytest.raises(EnvironmentBuildError) as failure:
        ensure_environment(kind, tmp_path)
    message = str(failure.value)
    assert "building the standin lab environment failed (exit 1) at:" in message
    assert f"-m pip install --no-index {MISSING}" in message
    assert f"No matching distribution found for {MISSING}" in message
    assert message.endswith("retry with: gpurouter lab standin build")
    # Nothing that looks complete, nothing half-built: only the lock and the log stay.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".standin.lock", "standin-build.log"]
    assert find_environment(tmp_path, kind) is None


def test_a_build_killed_midway_is_cleared_by_the_next_one(tmp_path: Path) -> None:
    kind = _kind()
    stale = tmp_path / ".standin.partial-99999"
    (stale / "bin").mkdir(parents=True)
    environment = ensure_environment(kind, tmp_path)
    assert not stale.exists()
    assert environment.root == tmp_path / "standin"
    assert environment.launcher.read_text() == kind.launcher


def test_a_complete_environment_is_reused_and_a_changed_recipe_is_not(tmp_path: Path) -> None:
    kind = _kind()
    built = ensure_environment(kind, tmp_path)
    marker = built.root / "gpurouter-lab.json"
    written = marker.stat().st_mtime_ns
    assert ensure_environment(kind, tmp_path).root == built.root
    assert marker.stat().st_mtime_ns == written
    assert find_environment(tmp_path, _kind(remove_after=("something-else",))) is None


def test_the_lab_home_follows_its_variable_then_the_cache_directory() -> None:
    assert lab_home({HOME_ENV: "/srv/lab"}) == Path("/srv/lab")
    assert lab_home({"XDG_CACHE_HOME": "/c"}) == Path("/c/gpurouter/lab")
    assert lab_home({}) == Path.home() / ".cache" / "gpurouter" / "lab"
