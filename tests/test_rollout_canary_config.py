"""The fleet file's keys for canaries and blue-green: a replica's ``version``, the
``rollout.canary`` section and ``rollout.green``, each problem with its file, line and key."""

from __future__ import annotations

import pytest

from router.config import parse_fleet
from router.config.loader import parse_rollout_settings
from router.config.schema import CanaryConfig, RolloutConfig
from router.errors import ConfigError

FLEET = """\
model: m
nodes:
  - name: n0
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: V100-32GB, memory_gib: 32}
    replicas:
      - {id: a, endpoint: "http://127.0.0.1:18001", gpus: [0]}
      - {id: b, endpoint: "http://127.0.0.1:18002", gpus: [1], version: VERSION}
rollout:
  green: GREEN
  canary: CANARY
"""


def _fleet(version: str = "m-v2", green: str = "m-v2", canary: str = "{}") -> str:
    return FLEET.replace("VERSION", version).replace("GREEN", green).replace("CANARY", canary)


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_fleet(text, "fleet.yaml")
    return [str(p) for p in caught.value.problems]


def test_a_good_file_gives_the_replicas_version_and_the_canary_rules() -> None:
    canary = "{steps: [10, 100], dwell_s: 30, min_requests: 50, max_ttft_ratio: 3}"
    fleet = parse_fleet(_fleet(canary=canary), "fleet.yaml")
    assert [r.version for r in fleet.replicas] == [None, "m-v2"]
    assert fleet.rollout.green == "m-v2"
    assert fleet.rollout.canary == CanaryConfig(
        steps=(10.0, 100.0), dwell_s=30.0, min_requests=50, max_ttft_ratio=3.0
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            _fleet(version='"m v2"', green="m-v3"),
            "fleet.yaml:9: nodes[0].replicas[1].version: must be a model name",
        ),
        (_fleet(green="m-v3"), "fleet.yaml:11: rollout.green: no replica has 'version: m-v3'"),
        (
            _fleet(canary="{steps: [50, 25]}"),
            "fleet.yaml:12: rollout.canary.steps: each step must be above the one before",
        ),
        (
            _fleet(canary="{steps: [0, 100]}"),
            "fleet.yaml:12: rollout.canary.steps: each step must be > 0 and <= 100",
        ),
        (
            _fleet(canary="{max_ttft_ratio: 0.5}"),
            "fleet.yaml:12: rollout.canary.max_ttft_ratio: must be > 1",
        ),
        (
            _fleet(canary="{min_requests: 0}"),
            "fleet.yaml:12: rollout.canary.min_requests: must be >= 1",
        ),
        (
            _fleet(canary="{window: 30}"),
            "fleet.yaml:12: rollout.canary.window: unknown key 'window'",
        ),
    ],
)
def test_each_bad_key_is_named_with_its_line(text: str, problem: str) -> None:
    assert any(p.startswith(problem) for p in _problems(text)), _problems(text)


def test_a_green_set_that_is_every_replica_of_its_model_is_refused() -> None:
    text = _fleet().replace("gpus: [0]}", "gpus: [0], version: m-v2}")
    assert any("every replica of m is green" in p for p in _problems(text))


def test_a_commands_canary_keys_go_over_the_fleet_files_not_over_the_defaults() -> None:
    base = RolloutConfig(canary=CanaryConfig(dwell_s=7.0, min_requests=9))
    config = parse_rollout_settings({"canary": {"min_requests": 3}}, base)
    assert config.canary.dwell_s == 7.0
    assert config.canary.min_requests == 3
