"""The MQTT topic layout, version 1: every topic lives under ``gpurouter/v1/<cluster>/``.

=============================  ==========  =====  ========  =====================================
topic                          sender      QoS    retained  payload
=============================  ==========  =====  ========  =====================================
``nodes/<node>/status``        node agent  1      yes       :class:`~router.telemetry.NodeStatus`
``nodes/<node>/gpus``          node agent  0      no        :class:`~router.telemetry.GpuBatch`
``routers/<router>/stats``     router      0      no        the router's queue and replicas
``control/desired/<slot>``     operators   1      yes       a versioned command (control_topics)
``control/acks/<router>``      router      1      no        what a router did with a command
``events``                     router      1      no        the audit trail, one event each
=============================  ==========  =====  ========  =====================================

Names that become a topic level (cluster, node, router, replica) may not hold ``/``, ``+``
or ``#``. :meth:`Topics.parse_node` reads a node topic back and returns None for anything
that is not exactly one of ours, so receivers can ignore what they did not ask for (amqtt may
deliver retained messages that match other clients' filters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ROOT = "gpurouter/v1"
_BAD_LEVEL = re.compile(r"[/+#\x00]")

NodeKind = Literal["status", "gpus"]
RouterKind = Literal["stats", "ack"]


def check_level(name: str, what: str) -> str:
    """``name`` if it can be one topic level; ValueError naming ``what`` otherwise."""
    if not name or len(name) > 128 or _BAD_LEVEL.search(name):
        raise ValueError(f"{what} {name!r} cannot be an MQTT topic level (no '/', '+', '#')")
    return name


@dataclass(frozen=True, slots=True)
class Topics:
    """The topics of one cluster."""

    cluster: str

    def __post_init__(self) -> None:
        check_level(self.cluster, "cluster name")

    @property
    def prefix(self) -> str:
        return f"{ROOT}/{self.cluster}/"

    def status(self, node: str) -> str:
        return f"{self.prefix}nodes/{node}/status"

    def gpus(self, node: str) -> str:
        return f"{self.prefix}nodes/{node}/gpus"

    def router_stats(self, router: str) -> str:
        return f"{self.prefix}routers/{router}/stats"

    def desired(self, slot: str) -> str:
        return f"{self.prefix}control/desired/{slot}"

    def acks(self, router: str) -> str:
        return f"{self.prefix}control/acks/{router}"

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    # Filters: what a receiver subscribes to.
    @property
    def all_status(self) -> str:
        return f"{self.prefix}nodes/+/status"

    @property
    def all_gpus(self) -> str:
        return f"{self.prefix}nodes/+/gpus"

    @property
    def all_desired(self) -> str:
        return f"{self.prefix}control/desired/#"

    @property
    def all_acks(self) -> str:
        return f"{self.prefix}control/acks/+"

    @property
    def all_router_stats(self) -> str:
        return f"{self.prefix}routers/+/stats"

    def parse_node(self, topic: str) -> tuple[str, NodeKind] | None:
        """``(node, "status" | "gpus")`` for a node topic of this cluster, else None."""
        if not topic.startswith(self.prefix):
            return None
        parts = topic[len(self.prefix) :].split("/")
        if len(parts) != 3 or parts[0] != "nodes" or not parts[1]:
            return None
        if parts[2] == "status":
            return parts[1], "status"
        if parts[2] == "gpus":
            return parts[1], "gpus"
        return None

    def parse_router(self, topic: str) -> tuple[str, RouterKind] | None:
        """``(router, "stats" | "ack")`` for a router's stats or acknowledgement topic of
        this cluster, else None."""
        if not topic.startswith(self.prefix):
            return None
        parts = topic[len(self.prefix) :].split("/")
        match parts:
            case ["routers", router, "stats"] if router:
                return router, "stats"
            case ["control", "acks", router] if router:
                return router, "ack"
        return None

    def parse_desired(self, topic: str) -> str | None:
        """The slot of a ``control/desired/<slot>`` topic of this cluster, else None."""
        head = f"{self.prefix}control/desired/"
        if not topic.startswith(head) or len(topic) == len(head):
            return None
        return topic[len(head) :]
