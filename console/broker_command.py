"""``gpurouter broker``: run the embedded MQTT broker (amqtt) on loopback, in the foreground."""

from __future__ import annotations

import argparse
import asyncio
from typing import TextIO

from router.errors import GpuRouterError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    p.add_argument("--port", type=int, default=1883, help="port (1883); 0 picks a free one")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: amqtt is needed only when the broker runs.
    from router.telemetry.embedded_broker import serve

    try:
        asyncio.run(serve(args.host, args.port))
    except GpuRouterError as exc:
        err.write(f"gpurouter broker: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
