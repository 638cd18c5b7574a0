"""The embedded MQTT broker: amqtt, on loopback only, in a process of its own.

``broker: embedded`` (the default) needs nothing installed: :class:`EmbeddedBroker` starts
amqtt (an asyncio MQTT 3.1.1 broker) in a child process and returns its ``mqtt://`` URL.

Why these choices:

- **Loopback only.** amqtt's own default listener binds every interface; a broker that
  carries control commands must not be reachable from the network by accident. The host
  must be a loopback address.
- **Plugins trimmed.** amqtt loads event and packet loggers and a ``$SYS`` publisher by
  default, which cost about a third of its throughput; only the anonymous-auth plugin stays
  (amqtt refuses every client when no auth plugin answers).
- **Its own process.** In the router's (and console's) event loop amqtt competes with them
  for the CPU; measured in bench/bench_ingest.py (docs/benchmarks.md). The child exits when
  its parent goes away (it watches its stdin), so no broker outlives the router.
- **One race mended.** amqtt walks its subscription table across awaits; the table here
  iterates over a copy (:class:`SnapshotIterDict`).

``python -m router.telemetry.embedded_broker --port 0`` runs one in the foreground and prints
``listening <host> <port>`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from router.errors import TelemetryError

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 5.0
_READY = "listening"


def amqtt_config(host: str, port: int) -> dict[str, Any]:
    """amqtt's configuration: one TCP listener on ``host:port``, anonymous auth only."""
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {
        "listeners": {"default": {"type": "tcp", "bind": bind}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


def check_loopback(host: str) -> str:
    """``host`` if it is a loopback address (``localhost`` becomes 127.0.0.1)."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise TelemetryError(f"the embedded broker listens on loopback only, not {host!r}")


class SnapshotIterDict(dict[str, Any]):
    """A dict whose iteration walks a copy, so entries added or removed meanwhile are safe.

    amqtt 0.12 iterates its subscription table across awaits (while it sends a connecting
    client the retained messages, and while it broadcasts a message); another client's
    subscribe or disconnect in that await changed the table and killed the walker's session
    ("dictionary changed size during iteration"). The table holds one entry per topic
    filter; bench/bench_ingest.py read no cost from the copies.
    """

    def __iter__(self) -> Iterator[str]:
        return iter(list(super().keys()))

    def keys(self) -> Any:
        return dict(list(super().items())).keys()

    def items(self) -> Any:
        return dict(list(super().items())).items()

    def values(self) -> Any:
        return dict(list(super().items())).values()


def url_of(host: str, port: int) -> str:
    return f"mqtt://[{host}]:{port}" if ":" in host else f"mqtt://{host}:{port}"


class EmbeddedBroker:
    """An amqtt broker on ``host:port`` (port 0: any free one), run in a child process.

    ``in_process=True`` runs it in the caller's event loop instead; kept for the benchmark
    that compares the two, not for production.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, in_process: bool = False):
        self.host = check_loopback(host)
        self.port = port
        self.in_process = in_process
        self._proc: asyncio.subprocess.Process | None = None
        self._broker: Any = None

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)

    @property
    def running(self) -> bool:
        if self.in_process:
            return self._broker is not None
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> str:
        """Start listening; the broker's URL (``mqtt://127.0.0.1:PORT``).

        After a :meth:`stop` or :meth:`kill` it starts again on the same port.
        """
        if self.running:
            return self.url
        if self.in_process:
            self._broker, self.port = await _start_amqtt(self.host, self.port)
        else:
            self.port = await self._spawn()
        return self.url

    async def stop(self) -> None:
        """Stop the broker; clients see their connection close."""
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await broker.shutdown()
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the child stops when its stdin closes
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), _STOP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def kill(self) -> None:
        """Kill the broker process at once, as a crash would (for tests of reconnecting)."""
        proc, self._proc = self._proc, None
        if proc is None:
            await self.stop()
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _spawn(self) -> int:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "router.telemetry.embedded_broker",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--exit-with-parent",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._proc = proc
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        words = line.decode(errors="replace").split()
        if len(words) != 3 or words[0] != _READY:
            await self.stop()
            raise TelemetryError(f"the embedded broker did not start on {self.url}")
        return int(words[2])


async def _start_amqtt(host: str, port: int) -> tuple[Any, int]:
    from amqtt.broker import Broker  # imported here: only the broker process needs amqtt

    for name in ("amqtt", "transitions"):  # amqtt logs every connection at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    broker = Broker(amqtt_config(host, port))
    broker._subscriptions = SnapshotIterDict()  # see SnapshotIterDict: amqtt's race, mended
    try:
        await broker.start()
    except Exception as exc:  # amqtt wraps a taken port and more in BrokerError
        raise TelemetryError(f"the embedded broker cannot listen on {host}:{port}: {exc}") from None
    return broker, _bound_port(broker, port)


def _bound_port(broker: Any, asked: int) -> int:
    """The port the listener got (asked for 0: the OS chose). amqtt has no public way to
    ask, so read its server's socket, and fall back to the port asked for."""
    servers = getattr(broker, "_servers", {})
    server = servers.get("default")
    sockets = getattr(getattr(server, "instance", None), "sockets", None) or ()
    for sock in sockets:
        return int(sock.getsockname()[1])
    return asked


async def serve(host: str, port: int, *, exit_with_parent: bool = False) -> None:
    """Run a broker until SIGTERM/SIGINT; with ``exit_with_parent``, also once stdin closes
    (the parent that holds the other end went away)."""
    broker, bound = await _start_amqtt(check_loopback(host), port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if exit_with_parent:
        await loop.connect_read_pipe(lambda: _ParentWatch(stop), sys.stdin)
    print(f"{_READY} {host} {bound}", flush=True)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):  # shutting down: nothing left to report to
            await asyncio.wait_for(broker.shutdown(), _STOP_TIMEOUT_S)


class _ParentWatch(asyncio.Protocol):
    """Stops the broker when the parent's end of stdin closes."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m router.telemetry.embedded_broker",
        description="Run gpurouter's embedded MQTT broker (amqtt) on loopback.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address (127.0.0.1)")
    parser.add_argument("--port", type=int, default=1883, help="port; 0 picks a free one")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="also stop when stdin closes"
    )
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.host, args.port, exit_with_parent=args.exit_with_parent))
    except TelemetryError as exc:
        print(f"gpurouter broker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
