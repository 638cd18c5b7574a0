"""`gpurouter run`'s text lines: what each says without the docs at hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.cli import main
from tests.fleet_factory import TWO_CARD_YAML

DRILL = """\
name: drain-drill
fleet: fleet.yaml
workload:
  phases:
    - {duration: 6, load: 0.5}
drain: 2
actions:
  - {at: 2.5, command: drain, replica: v100}
checks:
  - {metric: failed, max: 0}
"""


def test_each_sample_says_how_busy_each_replica_is_and_names_a_state_out_of_rotation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`busy a100 42% v100 draining 3%`: a percentage of the batch, the state when not active
    (it read `a100:a0.42 v100:d0.03`)."""
    (tmp_path / "fleet.yaml").write_text(TWO_CARD_YAML)
    (tmp_path / "drill.yaml").write_text(DRILL)
    assert main(["run", "--simulate", str(tmp_path / "drill.yaml")]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = [
        line.split("  busy ")[1] for line in lines if line.startswith("t=") and " busy " in line
    ]
    assert len(fields) == 6  # one a second
    active = re.compile(r"^a100 \d+% v100 \d+%$")
    out_of_rotation = re.compile(r"^a100 \d+% v100 (draining|drained) \d+%$")
    assert [bool(active.match(f)) for f in fields[:2]] == [True, True]
    assert all(out_of_rotation.match(f) for f in fields[2:]), fields
