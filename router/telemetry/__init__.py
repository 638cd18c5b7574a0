"""GPU telemetry: the versioned payloads node agents publish, and the NVML sampler behind them.

``schema`` holds the messages (:class:`GpuBatch`, :class:`NodeStatus`) with strict
``decode_*`` functions; ``nvml_sampler`` reads real GPUs; ``topics`` lays out the MQTT
topics; ``agent`` publishes a node (:class:`NodeAgent`); ``subscriber`` feeds a router core
(:class:`TelemetrySubscriber`); ``control_topics`` carries operator commands to
each router (:class:`ControlLink`), ``control_publisher`` sends them
(:class:`ControlPublisher`, :func:`publish_command`), ``control_messages`` and
``control_auth`` are their format and signature, ``desired_state`` the routers' copy on disk;
``embedded_broker`` runs amqtt on loopback (:class:`EmbeddedBroker`); ``engine_metrics``
reads replicas' own /metrics (:class:`EngineMetricsPoller`). docs/telemetry.md describes them.

Importing this package imports only the schema: the other modules (and pynvml, aiomqtt,
aiohttp) load on first use of a name from them, so ``python -m router.telemetry.<module>``
runs a module fresh and the schema stays cheap to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from router.telemetry.schema import (
    MAX_PAYLOAD_BYTES,
    SCHEMA_VERSION,
    GpuBatch,
    GpuInventory,
    GpuSample,
    MigDevice,
    NodeStatus,
    PayloadError,
    ProcessInfo,
    as_json,
    decode_gpus,
    decode_status,
    encode,
)

if TYPE_CHECKING:
    from router.telemetry.agent import EmulatedSource, NodeAgent
    from router.telemetry.connection import Backoff, BrokerTarget, resolve_target
    from router.telemetry.control_publisher import ControlPublisher, publish_command
    from router.telemetry.control_topics import ControlLink
    from router.telemetry.embedded_broker import EmbeddedBroker
    from router.telemetry.engine_metrics import EngineMetricsPoller, parse_engine_metrics
    from router.telemetry.nvml_sampler import NvmlSampler, NvmlUnavailableError, SystemInfo
    from router.telemetry.subscriber import TelemetrySubscriber
    from router.telemetry.topics import Topics

_LAZY = {
    "NvmlSampler": "nvml_sampler",
    "NvmlUnavailableError": "nvml_sampler",
    "SystemInfo": "nvml_sampler",
    "NodeAgent": "agent",
    "EmulatedSource": "agent",
    "Backoff": "connection",
    "BrokerTarget": "connection",
    "resolve_target": "connection",
    "ControlLink": "control_topics",
    "ControlPublisher": "control_publisher",
    "publish_command": "control_publisher",
    "EmbeddedBroker": "embedded_broker",
    "EngineMetricsPoller": "engine_metrics",
    "parse_engine_metrics": "engine_metrics",
    "TelemetrySubscriber": "subscriber",
    "Topics": "topics",
}

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "SCHEMA_VERSION",
    "Backoff",
    "BrokerTarget",
    "ControlLink",
    "ControlPublisher",
    "EmbeddedBroker",
    "EmulatedSource",
    "EngineMetricsPoller",
    "GpuBatch",
    "GpuInventory",
    "GpuSample",
    "MigDevice",
    "NodeAgent",
    "NodeStatus",
    "NvmlSampler",
    "NvmlUnavailableError",
    "PayloadError",
    "ProcessInfo",
    "SystemInfo",
    "TelemetrySubscriber",
    "Topics",
    "as_json",
    "decode_gpus",
    "decode_status",
    "encode",
    "parse_engine_metrics",
    "publish_command",
    "resolve_target",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        return getattr(importlib.import_module(f"router.telemetry.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
