"""Connecting to an MQTT broker: the ``--broker`` URL, credentials, TLS, and reconnecting.

A broker is named by a URL, ``mqtt://host[:port]`` (plain, port 1883) or
``mqtts://host[:port]`` (TLS, port 8883), optionally ``mqtt://user@host``. A password never
travels in the URL (it would show in process lists); it comes from the environment variable
the configuration names (``password_env``) or, failing that, ``GPUROUTER_BROKER_PASSWORD``.
A user name comes from the option, the URL, or ``GPUROUTER_BROKER_USERNAME``, in that order.

:func:`stay_connected` keeps one aiomqtt client connected: it runs a body while the
connection lasts and reconnects after a loss, waiting a capped exponential backoff with
jitter (:class:`Backoff`) so that a fleet of agents does not reconnect in lockstep.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import aiomqtt

from router.config.schema import BrokerConfig
from router.errors import TelemetryError

log = logging.getLogger(__name__)

USERNAME_ENV = "GPUROUTER_BROKER_USERNAME"
PASSWORD_ENV = "GPUROUTER_BROKER_PASSWORD"
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True, slots=True)
class BrokerTarget:
    """Everything needed to open a connection to one broker."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    keepalive_s: int = 30

    @property
    def url(self) -> str:
        """The URL without credentials, for display."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls else 'mqtt'}://{host}:{self.port}"

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``mqtts://``: the CA file's (or the system's) roots, and a
        client certificate when one is given; None for plain ``mqtt://``."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TelemetryError(f"cannot set up TLS for {self.url}: {exc}") from None
        return context


def parse_broker_url(url: str) -> tuple[str, int, bool, str | None]:
    """``(host, port, tls, username)`` from a ``mqtt://`` or ``mqtts://`` URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TelemetryError(f"broker URL {url!r}: {exc}") from None
    if parts.scheme not in _DEFAULT_PORTS:
        raise TelemetryError(f"broker URL {url!r}: expected mqtt://host[:port] or mqtts://...")
    if not parts.hostname:
        raise TelemetryError(f"broker URL {url!r}: no host")
    if parts.password is not None:
        raise TelemetryError(
            f"broker URL for {parts.hostname}: a password does not belong in the URL; "
            "name the environment variable that holds it (--password-env)"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise TelemetryError(f"broker URL {url!r}: unexpected path or query")
    user = unquote(parts.username) if parts.username else None
    return parts.hostname, port or _DEFAULT_PORTS[parts.scheme], parts.scheme == "mqtts", user


def resolve_target(
    config: BrokerConfig,
    *,
    url: str | None = None,
    username: str | None = None,
    password_env: str | None = None,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> BrokerTarget:
    """The broker to connect to: options override the fleet file's ``broker`` section.

    ``url`` must name a real broker here (``embedded`` is resolved by whoever starts one).
    """
    env = os.environ if environ is None else environ
    chosen = url or config.url
    if chosen == "embedded":
        raise TelemetryError("the embedded broker runs inside the router; give --broker URL")
    host, port, tls, url_user = parse_broker_url(chosen)
    var = password_env or config.password_env
    if var is not None and var not in env:
        raise TelemetryError(f"the broker password variable {var} is not set")
    password = env.get(var) if var is not None else env.get(PASSWORD_ENV)
    user = username or url_user or config.username or env.get(USERNAME_ENV)
    return BrokerTarget(
        host=host,
        port=port,
        tls=tls,
        username=user,
        password=password,
        ca_file=ca_file or config.ca_file,
        cert_file=cert_file or config.cert_file,
        key_file=key_file or config.key_file,
        keepalive_s=config.keepalive_s,
    )


class Backoff:
    """Capped exponential backoff with jitter: attempt n waits between half and all of
    ``min(cap, base * 2**n)`` seconds (the random half spreads a fleet's reconnects)."""

    def __init__(
        self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None
    ) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"backoff needs 0 < base <= cap, got {base_s}, {cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = rng if rng is not None else random.Random()
        self.attempt = 0

    def next_delay(self) -> float:
        """The wait before the next attempt; each call counts one more failure."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(self.attempt, 60))
        self.attempt += 1
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def reset(self) -> None:
        """A connection succeeded: the next failure starts from the base again."""
        self.attempt = 0


def make_client(
    target: BrokerTarget,
    *,
    identifier: str,
    will: aiomqtt.Will | None = None,
    max_queued_outgoing: int | None = 64,
    max_queued_incoming: int | None = 10_000,
    logger: logging.Logger | None = None,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
) -> aiomqtt.Client:
    """An aiomqtt client (MQTT 3.1.1, which every broker speaks, amqtt included).

    Both queues are bounded: a slow broker makes publishes fail (and the caller count them)
    instead of piling up memory, and a receiver that falls behind drops the excess.
    ``queue_type`` is the incoming queue's class (see :func:`screened_queue`).
    """
    return aiomqtt.Client(
        target.host,
        target.port,
        username=target.username,
        password=target.password,
        identifier=identifier,
        will=will,
        clean_session=True,
        keepalive=target.keepalive_s,
        timeout=10.0,
        tls_context=target.tls_context(),
        max_queued_outgoing_messages=max_queued_outgoing,
        max_queued_incoming_messages=max_queued_incoming,
        protocol=aiomqtt.ProtocolVersion.V311,
        logger=logger,
        queue_type=queue_type,
    )


def screened_queue(
    admit: Callable[[aiomqtt.Message], bool], on_full: Callable[[aiomqtt.Message], None]
) -> type[asyncio.Queue[aiomqtt.Message]]:
    """An incoming queue class that keeps only the messages ``admit`` lets in, and hands
    one that finds it full to ``on_full`` (aiomqtt would log a line per message).

    aiomqtt puts each message in its queue as it reads it off the socket; judging it there,
    before it takes a place, is what keeps a flood of junk from pushing out the message that
    matters. ``admit`` runs in the client's read callback, so it must be quick; should it
    raise (a bug), the message is let in for the receiver to judge rather than lost.
    """

    class ScreenedQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            try:
                admitted = admit(item)
            except Exception:
                log.exception("screening a message on %s", item.topic.value)
                admitted = True
            if not admitted:
                return
            try:
                super().put_nowait(item)
            except asyncio.QueueFull:
                on_full(item)

    return ScreenedQueue


ConnectionHook = Callable[[bool, str | None], None]
"""Told ``(True, None)`` on connect and ``(False, reason)`` on a loss or failed attempt."""


async def stay_connected(
    connect: Callable[[], aiomqtt.Client],
    body: Callable[[aiomqtt.Client], Awaitable[None]],
    *,
    backoff: Backoff,
    on_change: ConnectionHook | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Run ``body(client)`` on a fresh connection until it returns; reconnect on a loss.

    ``connect`` makes a new client for each attempt (so a will can change per connect).
    Returns when ``body`` returns; cancel the task to stop at once.
    """
    while True:
        try:
            async with connect() as client:
                backoff.reset()
                if on_change is not None:
                    on_change(True, None)
                await body(client)
                return
        except aiomqtt.MqttError as exc:
            reraise_cancellation()
            if on_change is not None:
                on_change(False, str(exc) or type(exc).__name__)
        await sleep(backoff.next_delay())


async def cancel_and_wait(task: asyncio.Task[None], *, recancel_after_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again if it carries on.

    A single cancel is not enough for a task in aiomqtt: on Python 3.11, ``asyncio.wait_for``
    (which aiomqtt awaits for every publish and subscribe) returns the reply instead of
    raising when the cancel lands just as the broker's answer arrives. The task then runs on,
    and ``await task`` would wait forever. An exception the task ended with is raised here.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_after_s)
        if not task.done():
            log.warning("task %s ignored a cancel; cancelling it again", task.get_name())
    if not task.cancelled():
        task.result()


async def publish(
    client: aiomqtt.Client,
    topic: str,
    payload: bytes,
    *,
    qos: int,
    retain: bool = False,
    timeout: float | None = None,
) -> None:
    """``client.publish``, except that a cancel arriving with the broker's reply still cancels.

    aiomqtt awaits every publish (QoS 0 included) through ``asyncio.wait_for``, which on
    Python 3.11 can return normally when the cancel and the reply come together; a publishing
    loop would then go round forever, and a TaskGroup waiting for it with it.
    """
    await client.publish(topic, payload, qos=qos, retain=retain, timeout=timeout)
    reraise_cancellation()


async def subscribe(client: aiomqtt.Client, topic: str, *, qos: int) -> None:
    """``client.subscribe``, with the same care for a cancel as :func:`publish`."""
    await client.subscribe(topic, qos=qos)
    reraise_cancellation()


def reraise_cancellation() -> None:
    """Raise CancelledError if a cancel of the running task is outstanding.

    Two places need it: after an aiomqtt call that may have swallowed the cancel (see
    :func:`publish`), and in an MqttError handler. On the way out of a cancelled task,
    aiomqtt's ``__aexit__`` waits for the broker to confirm the disconnect and raises
    MqttError when it does not (a timeout, or an unclean close). That error replaces the
    CancelledError, so a reconnect loop catching MqttError would carry on, and whoever awaits
    the cancelled task would wait forever.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
