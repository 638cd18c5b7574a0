"""Where the demo's default fleet file is: the repository's examples/ directory.

Looked for in the current directory first (a checkout), then beside the installed package
(``pip install -e .`` of a checkout keeps ``examples/`` next to ``router/``).
"""

from __future__ import annotations

from pathlib import Path

from router.errors import GpuRouterError

__all__ = ["DEFAULT_FLEET", "default_fleet_path"]

DEFAULT_FLEET = Path("examples/fleets/mixed-a100-v100.yaml")


def default_fleet_path(cwd: Path | None = None) -> Path:
    """The default fleet file; GpuRouterError naming the places looked in if it is in none."""
    places = [(cwd or Path.cwd()) / DEFAULT_FLEET, Path(__file__).parents[2] / DEFAULT_FLEET]
    for place in places:
        if place.is_file():
            return place
    looked = " or ".join(str(p) for p in places)
    raise GpuRouterError(f"no default fleet file at {looked}; give one with --fleet FILE")
