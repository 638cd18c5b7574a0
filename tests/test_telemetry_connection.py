"""Broker URLs, credentials, TLS options, and the embedded broker's loopback rule."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
from pathlib import Path
from typing import cast

import aiomqtt
import pytest

from router.config.schema import BrokerConfig
from router.errors import TelemetryError
from router.telemetry.connection import (
    Backoff,
    cancel_and_wait,
    make_client,
    parse_broker_url,
    publish,
    resolve_target,
    stay_connected,
)
from router.telemetry.embedded_broker import EmbeddedBroker, amqtt_config
from tests.mqtt_fixtures import Mosquitto, mosquitto_binary


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://broker.lan", ("broker.lan", 1883, False, None)),
        ("mqtts://broker.lan", ("broker.lan", 8883, True, None)),
        ("mqtt://ops%40x@10.0.0.2:1884", ("10.0.0.2", 1884, False, "ops@x")),
        ("mqtts://[::1]:8884/", ("::1", 8884, True, None)),
    ],
)
def test_broker_urls_give_host_port_tls_and_user(
    url: str, expected: tuple[str, int, bool, str | None]
) -> None:
    assert parse_broker_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://h", "expected mqtt://"),
        ("mqtt://", "no host"),
        ("mqtt://u:secret@h", "password does not belong in the URL"),
        ("mqtt://h:99999", "out of range"),
        ("mqtt://h/topic", "unexpected path"),
    ],
)
def test_bad_broker_urls_say_what_is_wrong(url: str, reason: str) -> None:
    with pytest.raises(TelemetryError, match=reason) as caught:
        parse_broker_url(url)
    assert "secret" not in str(caught.value)


def test_options_override_the_fleet_file_and_the_password_comes_from_the_environment() -> None:
    config = BrokerConfig(url="mqtt://file-broker", username="file-user", password_env="PW")
    target = resolve_target(config, environ={"PW": "s3cret"})
    assert (target.host, target.username, target.password) == ("file-broker", "file-user", "s3cret")
    target = resolve_target(
        config, url="mqtts://cli-broker:9000", username="cli", password_env="OTHER",
        environ={"PW": "s3cret", "OTHER": "x"},
    )  # fmt: skip
    assert (target.url, target.username, target.password) == ("mqtts://cli-broker:9000", "cli", "x")
    fallback = resolve_target(
        BrokerConfig(url="mqtt://b"),
        environ={"GPUROUTER_BROKER_USERNAME": "env-user", "GPUROUTER_BROKER_PASSWORD": "pw"},
    )
    assert (fallback.username, fallback.password) == ("env-user", "pw")
    with pytest.raises(TelemetryError, match="PW is not set"):
        resolve_target(config, environ={})
    with pytest.raises(TelemetryError, match="give --broker URL"):
        resolve_target(BrokerConfig(), environ={})


def test_tls_uses_the_ca_file_and_reports_a_missing_one(tmp_path: Path) -> None:
    plain = resolve_target(BrokerConfig(url="mqtt://b"), environ={})
    assert plain.tls_context() is None
    tls = resolve_target(BrokerConfig(url="mqtts://b"), environ={}).tls_context()
    assert isinstance(tls, ssl.SSLContext)
    assert tls.verify_mode is ssl.CERT_REQUIRED
    missing = resolve_target(
        BrokerConfig(url="mqtts://b", ca_file=str(tmp_path / "none.pem")), environ={}
    )
    with pytest.raises(TelemetryError, match="cannot set up TLS"):
        missing.tls_context()


def test_the_embedded_broker_listens_on_loopback_only_with_trimmed_plugins() -> None:
    with pytest.raises(TelemetryError, match="loopback only"):
        EmbeddedBroker("0.0.0.0")
    config = amqtt_config("127.0.0.1", 0)
    assert config["listeners"]["default"]["bind"] == "127.0.0.1:0"
    assert list(config["plugins"]) == ["amqtt.plugins.authentication.AnonymousAuthPlugin"]


async def test_user_and_password_reach_a_broker_that_requires_them(tmp_path: Path) -> None:
    """Mosquitto with a password file: the right password connects, a wrong one does not."""
    binary = mosquitto_binary()
    tool = shutil.which("mosquitto_passwd") or str(Path(binary).parents[1] / "bin/mosquitto_passwd")
    passwords = tmp_path / "passwd"
    passwords.write_text("")
    made = await asyncio.create_subprocess_exec(tool, "-b", str(passwords), "agent", "right")
    assert await made.wait() == 0
    broker = Mosquitto(binary, tmp_path, password_file=passwords)
    await broker.start()
    config = BrokerConfig(url=broker.url, username="agent", password_env="PW")
    try:
        async with make_client(resolve_target(config, environ={"PW": "right"}), identifier="ok"):
            pass
        wrong = resolve_target(config, environ={"PW": "wrong"})
        with pytest.raises(aiomqtt.MqttError):
            async with make_client(wrong, identifier="refused"):
                pass
    finally:
        await broker.stop()


class _UncleanExit:
    """Connects at once, and on exit raises what aiomqtt raises when the broker never
    confirms the disconnect: MqttError("Operation timed out")."""

    async def __aenter__(self) -> _UncleanExit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        raise aiomqtt.MqttError("Operation timed out")


async def test_a_cancelled_link_stops_even_when_the_disconnect_fails() -> None:
    """The MqttError from an unclean disconnect must not swallow the cancellation: the
    loop would reconnect forever and ``await task`` in a stop() would never return."""
    entered = asyncio.Event()
    sleeps: list[float] = []

    async def body(_client: aiomqtt.Client) -> None:
        entered.set()
        await asyncio.Event().wait()

    async def no_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        raise AssertionError("the cancelled link went round to reconnect")

    task = asyncio.create_task(
        stay_connected(
            lambda: cast(aiomqtt.Client, _UncleanExit()), body, backoff=Backoff(), sleep=no_sleep
        )
    )
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sleeps == []


async def test_an_unclean_disconnect_without_a_cancel_still_reconnects() -> None:
    """Outside a cancel, the failed disconnect is one more lost connection: the loop waits
    out its backoff and connects again."""
    clients = iter([_UncleanExit(), contextlib.nullcontext()])
    changes: list[tuple[bool, str | None]] = []
    rounds = 0

    async def body(_client: aiomqtt.Client) -> None:
        nonlocal rounds
        rounds += 1

    async def no_sleep(seconds: float) -> None:
        pass

    await stay_connected(
        lambda: cast(aiomqtt.Client, next(clients)),
        body,
        backoff=Backoff(),
        on_change=lambda up, why: changes.append((up, why)),
        sleep=no_sleep,
    )
    assert rounds == 2
    assert changes == [(True, None), (False, "Operation timed out"), (True, None)]


async def test_cancel_and_wait_ends_a_task_that_swallowed_its_first_cancel() -> None:
    """As Python 3.11's wait_for does when the cancel meets the awaited reply: the task
    carries on once; a second cancel ends it."""
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed += 1
        await asyncio.Event().wait()

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait(task, recancel_after_s=0.01)
    assert task.cancelled()
    assert swallowed == 1


async def test_cancel_and_wait_raises_what_the_task_failed_with() -> None:
    async def failing() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


class _ReplyWithTheCancel:
    """A client whose publish returns normally when cancelled, as aiomqtt's does on Python
    3.11 when the cancel and the broker's reply arrive together."""

    def __init__(self) -> None:
        self.calls = 0

    async def publish(self, *_args: object, **_kwargs: object) -> None:
        self.calls += 1
        if self.calls == 1:  # later calls answer at once, so an unguarded loop just ends
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()


async def test_a_publishing_loop_stops_when_the_cancel_meets_the_reply() -> None:
    client = cast(aiomqtt.Client, _ReplyWithTheCancel())
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while rounds < 3:
            rounds += 1
            await publish(client, "t", b"x", qos=0)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rounds == 1
