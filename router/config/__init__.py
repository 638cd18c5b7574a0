"""Fleet configuration: the typed, frozen schema and the YAML loader that builds it."""

from router.config.loader import load_fleet, parse_fleet, unprofiled_kinds
from router.config.schema import (
    AdaptiveConfig,
    BrokerConfig,
    ControlConfig,
    CostConfig,
    FleetConfig,
    GpuConfig,
    NodeConfig,
    QueueConfig,
    ReplicaConfig,
    RetryConfig,
    RouterConfig,
    StrategyConfig,
    TimeoutConfig,
)

__all__ = [
    "AdaptiveConfig",
    "BrokerConfig",
    "ControlConfig",
    "CostConfig",
    "FleetConfig",
    "GpuConfig",
    "NodeConfig",
    "QueueConfig",
    "ReplicaConfig",
    "RetryConfig",
    "RouterConfig",
    "StrategyConfig",
    "TimeoutConfig",
    "load_fleet",
    "parse_fleet",
    "unprofiled_kinds",
]
