"""The embedded broker (amqtt) survives clients that connect while others subscribe.

amqtt 0.12 walks its table of subscriptions when a client connects and waits, mid-walk,
while it sends the client retained messages; a subscription made by another client in that
wait changed the table under the walk, and the connecting client's session died
("dictionary changed size during iteration"). CI met it as a flaky telemetry test. A
raw MQTT 3.1.1 client here stops reading while a large retained message is sent to it, so the
broker's wait (for room in the socket's buffer) is certain, and the subscribe lands inside it.
"""

from __future__ import annotations

import asyncio
import struct

import aiomqtt

from router.telemetry.embedded_broker import EmbeddedBroker, SnapshotIterDict

_REPLY_TIMEOUT_S = 10.0
_LARGE = 8 << 20  # well past what loopback's socket buffers hold unread


def _packet(kind: int, body: bytes) -> bytes:
    """A packet with MQTT's variable-length remaining-length field."""
    size, length = len(body), bytearray()
    while True:
        size, digit = divmod(size, 128)
        length.append(digit | (0x80 if size else 0))
        if not size:
            return bytes([kind]) + bytes(length) + body


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("!H", len(data)) + data


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    kind = (await reader.readexactly(1))[0]
    size, shift = 0, 0
    while True:
        digit = (await reader.readexactly(1))[0]
        size += (digit & 0x7F) << shift
        shift += 7
        if not digit & 0x80:
            return kind, await reader.readexactly(size)


async def _next(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    return await asyncio.wait_for(_read_packet(reader), _REPLY_TIMEOUT_S)


async def test_a_client_connecting_while_another_subscribes_keeps_its_session() -> None:
    async with (
        EmbeddedBroker() as broker,
        aiomqtt.Client("127.0.0.1", broker.port, identifier="holder") as holder,
    ):
        await holder.publish("t/a", b"k" * _LARGE, qos=1, retain=True)
        await holder.subscribe("t/#", qos=1)
        reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
        try:
            connect = _text("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + _text("slow")
            writer.write(_packet(0x10, connect))
            assert (await _next(reader))[0] == 0x20  # CONNACK; the retained message waits unread
            async with aiomqtt.Client("127.0.0.1", broker.port, identifier="late") as late:
                await late.subscribe("u/new")  # the table grows while the broker is blocked
                kind, body = await _next(reader)
                assert kind & 0xF0 == 0x30  # PUBLISH
                assert len(body) > _LARGE  # all of it
                writer.write(_packet(0x82, b"\x00\x01" + _text("v/x") + b"\x00"))  # SUBSCRIBE
                assert (await _next(reader))[0] == 0x90  # SUBACK: the session lives
        finally:
            writer.close()


def test_the_snapshot_dict_iterates_a_copy_that_later_changes_do_not_touch() -> None:
    table = SnapshotIterDict({"a": 1, "b": 2})
    seen = []
    for key in table:
        seen.append(key)
        table[key + "!"] = 0
    for key, _ in table.items():
        del table[key]
    assert seen == ["a", "b"]
    assert table == {}
    assert list(SnapshotIterDict({"x": 1}).values()) == [1]
    assert list(SnapshotIterDict({"x": 1}).keys()) == ["x"]
