"""Each router keeps the operator's last applied desired state on disk, and starts from it
when the broker has lost its retained messages."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from router.config import parse_fleet
from router.config.schema import ControlConfig
from router.control import ControlSurface, Drain, SetStrategy, SetWeight
from router.core import RouterCore
from router.errors import ConfigError, ControlError
from router.replica import ReplicaState
from router.telemetry.control_topics import (
    ControlLink,
    ControlPublisher,
    encode_desired,
    slot_of,
)
from router.telemetry.desired_state import DesiredStateFile, default_state_path, state_path
from tests.mqtt_fixtures import Broker, until
from tests.telemetry_helpers import FLEET_FILE, fleet, linked, quick_backoff, target

CLUSTER = "h100-a100-l4"
SECRET = b"test-control-secret-0123"


def router(url: str, path: Path, name: str = "ra") -> tuple[ControlLink, ControlSurface]:
    surface = ControlSurface(RouterCore(fleet()))
    link = ControlLink(
        surface,
        target=target(url),
        router_id=name,
        backoff=quick_backoff(),
        secret=SECRET,
        state=DesiredStateFile(path, CLUSTER),
    )
    return link, surface


def operators_word(surface: ControlSurface) -> tuple[str, ReplicaState, float]:
    core = surface.core
    return core.strategy.name, core.replica("l4-0").state, core.replica("h100-0").weight


def actors(surface: ControlSurface) -> list[str]:
    return [f"{e.actor} {e.kind}" for e in surface.audit if ":" in e.actor]


async def test_a_router_started_after_the_broker_lost_its_retained_state_applies_its_own(
    mqtt_broker: Broker, tmp_path: Path
) -> None:
    """Restarted with the broker up, a router applies each command once (file, then the
    same retained version, ignored); restarted after a broker crash that lost the retained
    messages, it applies the saved state, not the fleet file's."""
    path = tmp_path / "state" / "desired.json"
    link, surface = router(mqtt_broker.url, path)
    async with (
        linked(link),
        ControlPublisher(target(mqtt_broker.url), CLUSTER, origin="alice", secret=SECRET) as op,
    ):
        await op.publish(SetStrategy("least-connections"))
        await op.publish(Drain("l4-0"))
        await op.publish(SetWeight("h100-0", 3.0))
        await until(lambda: len(link.applied) == 3, what="three commands applied")
    word = operators_word(surface)
    assert word == ("least-connections", ReplicaState.DRAINED, 3.0)
    assert json.loads(path.read_text())["slots"].keys() == link.applied.keys()

    again, surface = router(mqtt_broker.url, path)
    async with linked(again):
        await until(lambda: again.applied == link.applied, what="the retained state seen")
    assert operators_word(surface) == word
    assert again.restored == 3
    assert actors(surface) == [
        "restored:alice strategy",
        "restored:alice drain",
        "restored:alice weight",
    ]

    await mqtt_broker.kill()
    await mqtt_broker.start()
    fresh = ControlSurface(RouterCore(fleet()))
    assert operators_word(fresh) != word  # what the fleet file alone would give
    after_crash, surface = router(mqtt_broker.url, path)
    async with linked(after_crash):
        assert operators_word(surface) == word
        async with ControlPublisher(
            target(mqtt_broker.url), CLUSTER, origin="bob", secret=SECRET
        ) as op:
            await op.publish(SetStrategy("round-robin"))
        await until(lambda: surface.core.strategy.name == "round-robin", what="a new command")
    saved = DesiredStateFile(path, CLUSTER).load()
    assert saved["strategy"]["origin"] == "bob"
    assert saved.keys() == {"strategy", "service/l4-0", "weight/h100-0"}


def test_the_file_is_replaced_whole_and_kept_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "state.json"
    store = DesiredStateFile(path, CLUSTER)
    assert store.load() == {}
    store.save({"strategy": {"v": 1, "version": 1}})
    store.save({"strategy": {"v": 1, "version": 2}, "weight/a": {"v": 1, "version": 3}})
    assert store.load() == {"strategy": {"v": 1, "version": 2}, "weight/a": {"v": 1, "version": 3}}
    assert os.listdir(path.parent) == ["state.json"]  # no temporary file left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_state_file_that_cannot_be_written_is_counted_and_the_command_still_applied(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    link, surface = router("mqtt://127.0.0.1:1", blocker / "state.json")
    payload = _signed(SetStrategy("round-robin"), link)
    ack = link.handle(link.topics.desired("strategy"), payload)
    assert ack is not None
    assert ack.ok
    assert surface.core.strategy.name == "round-robin"
    assert link.state_errors == 1
    assert link.status().last_state_error is not None


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"{not json", "not JSON"),
        (b'{"v": 2}', "with v 1"),
        (b'{"v": 1, "cluster": "other", "slots": {}}', "cluster 'other'"),
        (b'{"v": 1, "cluster": "h100-a100-l4", "slots": []}', "slots must map"),
    ],
)
def test_an_unreadable_file_is_reported_and_the_router_starts_from_the_fleet_file(
    tmp_path: Path, content: bytes, error: str
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(ControlError, match=error):
        DesiredStateFile(path, CLUSTER).load()
    link, surface = router("mqtt://127.0.0.1:1", path)
    assert link.restore() == 0
    assert link.state_errors == 1
    assert surface.core.strategy.name == fleet().router.strategy.name


def test_an_edited_command_in_the_file_is_refused_by_its_signature(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    link, _ = router("mqtt://127.0.0.1:1", path)
    for command in (SetWeight("h100-0", 3.0), Drain("l4-0")):
        link.handle(link.topics.desired(slot_of(command)), _signed(command, link))
    data = json.loads(path.read_text())
    data["slots"]["weight/h100-0"]["command"]["weight"] = 16.0
    path.write_text(json.dumps(data))
    restarted, surface = router("mqtt://127.0.0.1:1", path)
    assert restarted.restore() == 1
    assert surface.core.replica("h100-0").weight == RouterCore(fleet()).replica("h100-0").weight
    assert surface.core.replica("l4-0").state is not ReplicaState.ACTIVE


def test_the_state_file_lives_under_the_state_dir_unless_the_fleet_file_says() -> None:
    assert default_state_path("prod", {"XDG_STATE_HOME": "/s"}) == Path(
        "/s/gpurouter/control/prod.json"
    )
    home = Path.home() / ".local" / "state" / "gpurouter" / "control" / "prod.json"
    assert default_state_path("prod", {}) == home
    config = fleet()
    assert state_path(config, {"XDG_STATE_HOME": "/s"}) == Path(
        f"/s/gpurouter/control/{CLUSTER}.json"
    )
    relative = dataclasses.replace(config, control=ControlConfig(state_file="run/desired.json"))
    assert state_path(relative, {}) == FLEET_FILE.parent / "run" / "desired.json"
    absolute = dataclasses.replace(config, control=ControlConfig(state_file="/var/lib/x.json"))
    assert state_path(absolute, {}) == Path("/var/lib/x.json")


def test_control_settings_are_checked_with_file_line_and_key() -> None:
    base = FLEET_FILE.read_text()
    text = (
        base + "control:\n  secret_env: 'not a name'\n  max_clock_skew_s: 1.0e9\n  state_file: ''\n"
    )
    with pytest.raises(ConfigError) as info:
        parse_fleet(text, "fleet.yaml")
    lines = len(base.splitlines())
    problems = {(p.key, p.line) for p in info.value.problems}
    assert problems == {
        ("control.secret_env", lines + 2),
        ("control.max_clock_skew_s", lines + 3),
        ("control.state_file", lines + 4),
    }
    good = parse_fleet(base + "control: {secret_env: CTL_SECRET, max_clock_skew_s: 5}\n", "f")
    assert good.control == ControlConfig(secret_env="CTL_SECRET", max_clock_skew_s=5.0)


def _signed(command: SetWeight | Drain | SetStrategy, link: ControlLink) -> bytes:
    version = int(link.wall_clock() * 1000)
    topic = link.topics.desired(slot_of(command))
    return encode_desired(command, version, "alice", 1.0, topic=topic, secret=SECRET)
