"""Shared fixtures. Keep this small and generic; helpers live in their own test modules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.mqtt_fixtures import BROKERS, Broker, Mosquitto, make_broker, mosquitto_binary


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-engines",
        action="store_true",
        help="run the tests against real vLLM engines (tests/real_engines, docs/real-engines.md)",
    )


@pytest.fixture
async def mosquitto(tmp_path: Path) -> AsyncIterator[Mosquitto]:
    """A running Mosquitto on a free loopback port (skipped where it is not installed,
    except on CI, where that fails)."""
    broker = Mosquitto(mosquitto_binary(), tmp_path)
    await broker.start()
    yield broker
    await broker.stop()


@pytest.fixture(params=BROKERS)
async def mqtt_broker(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Broker]:
    """A running broker, once the embedded amqtt and once Mosquitto."""
    broker = make_broker(request.param, tmp_path)
    await broker.start()
    yield broker
    await broker.stop()


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Routers keep the operators' desired state under ``$XDG_STATE_HOME`` and apply it at
    start: each test gets its own, so no test reads another's (or the user's)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
