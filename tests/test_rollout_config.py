"""The fleet file's ``rollout:`` section: defaults, updaters, and every mistake named with its
line and key (router/config/loader.py)."""

from __future__ import annotations

import pytest

from router.config import parse_fleet
from router.config.loader import parse_rollout_settings
from router.config.schema import CommandUpdaterConfig, RolloutConfig
from router.errors import ConfigError
from router.rollout.templates import fill, split_command, template_problem

FLEET = """\
nodes:
  - name: n0
    gpus: [{index: 0, model: A100-80GB, memory_gib: 80}]
    replicas: [{id: a, endpoint: "http://127.0.0.1:9001", model: m, gpus: [0]}]
"""


def _problems(rollout: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_fleet(FLEET + rollout, "fleet.yaml")
    return str(caught.value)


def test_a_fleet_without_a_rollout_section_gets_the_defaults() -> None:
    assert parse_fleet(FLEET, "fleet.yaml").rollout == RolloutConfig()


def test_a_command_updater_is_read() -> None:
    text = FLEET + 'rollout:\n  floor: 0.5\n  updater: {command: {run: "sv restart {replica}"}}\n'
    rollout = parse_fleet(text, "fleet.yaml").rollout
    assert rollout.floor == 0.5
    assert rollout.updater is not None
    assert rollout.updater.command == CommandUpdaterConfig("sv restart {replica}")


def test_every_mistake_of_the_section_is_named_with_its_line_and_key() -> None:
    problems = _problems(
        "rollout:\n"
        "  floor: 1.5\n"
        "  order: weakest\n"
        "  on_drain_timeout: kill\n"
        "  updater:\n"
        '    command: {run: "systemctl restart vllm@{replika}"}\n'
        "    http: {url: 'ftp://x/{replica}', body: '{\"v\": {version}}', method: GETT}\n"
    )
    assert "fleet.yaml:6: rollout.floor: must be > 0 and < 1, got 1.5" in problems
    assert "fleet.yaml:7: rollout.order: unknown order 'weakest'; did you mean" in problems
    assert "fleet.yaml:8: rollout.on_drain_timeout: unknown choice 'kill'" in problems
    assert "fleet.yaml:9: rollout.updater: needs exactly one of 'command' and 'http'" in problems
    assert "fleet.yaml:10: rollout.updater.command.run: unknown placeholder {replika}" in problems
    assert "fleet.yaml:11: rollout.updater.http.url: must be a URL" in problems
    assert "'ftp://x/{replica}'" in problems
    assert "fleet.yaml:11: rollout.updater.http.body: must be JSON" in problems
    assert "fleet.yaml:11: rollout.updater.http.method: unknown method 'GETT'" in problems


def test_an_updater_must_say_how() -> None:
    assert "got neither" in _problems("rollout:\n  updater: {}\n")


def test_a_command_with_an_unclosed_quote_is_refused() -> None:
    problems = _problems('rollout:\n  updater: {command: {run: "sh -c \'restart"}}\n')
    assert "rollout.updater.command.run: cannot be split into arguments" in problems


def test_only_the_four_names_are_placeholders_and_other_braces_are_text() -> None:
    values = {"replica": "a", "node": "n", "url": "http://h:1", "version": "v2"}
    body = '{"version": "{version}", "keep": "{{x}}"}'
    assert fill(body, values) == '{"version": "v2", "keep": "{{x}}"}'
    assert template_problem("{replica} {node} {url} {version}") is None
    assert template_problem("{host}") is not None


def test_a_command_is_split_into_words_without_a_shell() -> None:
    assert split_command("sh -c 'a; b' {replica}") == ["sh", "-c", "a; b", "{replica}"]
    with pytest.raises(ValueError, match="empty"):
        split_command("  ")


def test_a_rollout_commands_settings_go_over_the_fleet_files() -> None:
    base = parse_fleet(FLEET + "rollout:\n  floor: 0.5\n  drain_timeout_s: 9\n", "f").rollout
    merged = parse_rollout_settings({"floor": 0.8, "order": "strongest-first"}, base)
    assert (merged.floor, merged.order, merged.drain_timeout_s) == (0.8, "strongest-first", 9.0)


def test_a_rollout_commands_bad_settings_are_named_by_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rollout_settings({"floor": 0, "updater": {"command": {"run": ""}}}, RolloutConfig())
    text = str(caught.value)
    assert "rollout.floor: must be > 0 and < 1" in text
    assert "rollout.updater.command.run: cannot be split into arguments" in text
