"""The real-engine lab: real inference engines (vLLM for CPU today) on this machine, in an
environment of their own, serving tiny locally made models, for tests and benchmarks of
gpurouter in front of the real thing. docs/real-engines.md describes it."""

from router.lab.engine_kind import EngineKind, ServeOptions
from router.lab.engines import Engine, EngineRecord, free_port, wait_ready
from router.lab.environment import LabEnvironment, ensure_environment, find_environment
from router.lab.errors import EngineStartError, EnvironmentBuildError, LabError
from router.lab.home import HOME_ENV, lab_home
from router.lab.kinds import KINDS, engine_kind
from router.lab.lab import DEFAULT_MODEL, DEFAULT_SIZES, Lab, run_directory
from router.lab.models import SIZES, ModelSize, make_model, model_size

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SIZES",
    "HOME_ENV",
    "KINDS",
    "SIZES",
    "Engine",
    "EngineKind",
    "EngineRecord",
    "EngineStartError",
    "EnvironmentBuildError",
    "Lab",
    "LabEnvironment",
    "LabError",
    "ModelSize",
    "ServeOptions",
    "engine_kind",
    "ensure_environment",
    "find_environment",
    "free_port",
    "lab_home",
    "make_model",
    "model_size",
    "run_directory",
    "wait_ready",
]
