"""The one error tree of gpurouter.

    GpuRouterError            base: a message a person can act on
    ├── ConfigError           a fleet or scenario file is wrong (carries every problem found)
    ├── ControlError          an operator command was refused
    │   └── RolloutError      a rollout was refused or stopped
    ├── UpstreamError         a replica failed a request
    └── TelemetryError        telemetry could not be read or published

Errors are rendered once, at the edge: a line on stderr for the CLI, a notification in the
console, an OpenAI-style JSON body on HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass


class GpuRouterError(Exception):
    """Base of every error gpurouter raises on purpose."""

    title = "gpurouter error"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a file: where it is and what was expected."""

    file: str
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.key}: {self.message}"


class ConfigError(GpuRouterError):
    """A configuration file has one or more problems; all of them are listed."""

    title = "configuration error"

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ControlError(GpuRouterError):
    """An operator command was refused (unknown replica, bad value, wrong state)."""

    title = "command refused"


class RolloutError(ControlError):
    """A rollout was refused (its plan cannot keep the floor) or stopped (an update failed)."""

    title = "rollout failed"


class UpstreamError(GpuRouterError):
    """A replica failed a request."""

    title = "upstream error"


class TelemetryError(GpuRouterError):
    """Telemetry could not be read or published."""

    title = "telemetry error"
