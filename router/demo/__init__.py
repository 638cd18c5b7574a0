"""``gpurouter demo`` without its UI: the broker, the lab (emulated fleet, node agents, load)
and the router, each in a process of its own (docs/demo.md)."""

from router.demo.fleet_file import DEFAULT_FLEET, default_fleet_path
from router.demo.load import DemoLoad
from router.demo.report import RunTally, StrategySwitch, snapshot_line
from router.demo.stack import Demo, DemoOptions, check_ports_free

__all__ = [
    "DEFAULT_FLEET",
    "Demo",
    "DemoLoad",
    "DemoOptions",
    "RunTally",
    "StrategySwitch",
    "check_ports_free",
    "default_fleet_path",
    "snapshot_line",
]
