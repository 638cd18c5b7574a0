"""Scripted runs: a YAML scenario (fleet, workload phases, timed actions, checks) run on the
fleet simulator or live, printing a line per second and judging the checks.

``gpurouter run`` is the command line over this package; docs/scenarios.md the reference.
"""

from router.scenario.checks import CheckResult
from router.scenario.loader import load_scenario, parse_scenario
from router.scenario.report import RunReport
from router.scenario.runner_live import run_live
from router.scenario.runner_sim import run_simulated
from router.scenario.schema import Action, Check, FleetRef, Lengths, Phase, Scenario

__all__ = [
    "Action",
    "Check",
    "CheckResult",
    "FleetRef",
    "Lengths",
    "Phase",
    "RunReport",
    "Scenario",
    "load_scenario",
    "parse_scenario",
    "run_live",
    "run_simulated",
]
