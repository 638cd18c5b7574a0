"""Errors of the real-engine lab: each says what failed and what to do next."""

from __future__ import annotations

from router.errors import GpuRouterError

__all__ = ["EngineStartError", "EnvironmentBuildError", "LabError"]


class LabError(GpuRouterError):
    """The real-engine lab could not do what was asked."""

    title = "lab error"


class EnvironmentBuildError(LabError):
    """The engine's virtual environment could not be built; nothing half-built was kept."""


class EngineStartError(LabError):
    """An engine exited or never became ready; what was started has been stopped."""
