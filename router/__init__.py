"""gpurouter's routing core: UI-free, I/O-free at its centre, with adapters at the edge.

The public API is re-exported here; everything else is internal and may change.
"""

from router.clock import Clock, ManualClock, monotonic
from router.control import (
    Command,
    ControlSurface,
    Drain,
    Eject,
    EndSplit,
    Event,
    Preempt,
    Readmit,
    SetBatchSize,
    SetSplit,
    SetStrategy,
    SetWeight,
    Undrain,
    parse_command,
)
from router.core import Assignment, CoreListener, Finished, Outcome, RouterCore
from router.errors import (
    ConfigError,
    ControlError,
    GpuRouterError,
    Problem,
    TelemetryError,
    UpstreamError,
)
from router.imbalance import Band, band, imbalance_factor
from router.replica import Replica, ReplicaState, Telemetry
from router.request import Priority, Request, estimate_cost
from router.snapshot import FleetSnapshot, GpuModelSummary, ReplicaSnapshot
from router.strategies import STRATEGIES, Explanation, Strategy, create_strategy

__all__ = [
    "STRATEGIES",
    "Assignment",
    "Band",
    "Clock",
    "Command",
    "ConfigError",
    "ControlError",
    "ControlSurface",
    "CoreListener",
    "Drain",
    "Eject",
    "EndSplit",
    "Event",
    "Explanation",
    "Finished",
    "FleetSnapshot",
    "GpuModelSummary",
    "GpuRouterError",
    "ManualClock",
    "Outcome",
    "Preempt",
    "Priority",
    "Problem",
    "Readmit",
    "Replica",
    "ReplicaSnapshot",
    "ReplicaState",
    "Request",
    "RouterCore",
    "SetBatchSize",
    "SetSplit",
    "SetStrategy",
    "SetWeight",
    "Strategy",
    "Telemetry",
    "TelemetryError",
    "Undrain",
    "UpstreamError",
    "band",
    "create_strategy",
    "estimate_cost",
    "imbalance_factor",
    "monotonic",
    "parse_command",
]
