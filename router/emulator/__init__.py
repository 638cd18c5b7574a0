"""The replica emulator: OpenAI-compatible servers that answer as vLLM would on a given GPU.

One process hosts every replica of a fleet file, each on the loopback port of its endpoint.
Requests run through the same continuous-batching engine as the fleet simulator
(router.sim.engine), paced in real time (or ``time_scale`` times faster) by the performance
model; faults can be injected per replica; each emulated GPU's utilization, memory and power
can be read as NVML would report them. docs/emulator.md describes it all.
"""

from router.emulator.driver import EngineDriver, Generation
from router.emulator.faults import FaultCommand, FaultState, parse_fault_command
from router.emulator.fleet import EmulatedFleet, loopback_address
from router.emulator.openai_request import ApiError, CompletionRequest, parse_request
from router.emulator.replica import EmulatedReplica
from router.emulator.versions import VersionSwitch, parse_version_switch

__all__ = [
    "ApiError",
    "CompletionRequest",
    "EmulatedFleet",
    "EmulatedReplica",
    "EngineDriver",
    "FaultCommand",
    "FaultState",
    "Generation",
    "VersionSwitch",
    "loopback_address",
    "parse_fault_command",
    "parse_request",
    "parse_version_switch",
]
