"""The real-engine suite: gpurouter in front of real vLLM engines on this machine's CPU.

Run it with ``python3 -m pytest --real-engines tests/real_engines`` (without the option every
test here is skipped, with a reason naming that command). The first run builds the lab's vLLM
environment (a few minutes, about 3 GB, outside the checkout; docs/real-engines.md); later
runs reuse it. Every test in this folder is marked ``real_engines``.

Markers: ``real_engines`` (added here to every test of the folder) and ``real_engine_smoke``,
which a test puts on itself to be part of the short smoke CI runs after the main suite
(``python3 -m pytest --real-engines -m real_engine_smoke tests/real_engines``): keep that set
small, two engines and a few minutes.

Fixtures:

- ``vllm_lab`` (session): two engines of unequal speed serving ``vllm_lab.model`` (a
  :class:`router.lab.Lab`): ``.engines[i]`` with ``.url`` (``http://127.0.0.1:PORT``),
  ``.model``, ``.model_dir``, ``.core``, ``.freeze()`` / ``.thaw()`` (SIGSTOP / SIGCONT of
  ``VLLM::EngineCore`` only), ``.terminate()`` (SIGTERM to its tree), ``.kill_core()``
  (SIGKILL of ``VLLM::EngineCore``), ``.restart()``; ``.fleet_file`` (every weight at 1);
  ``.add_engine(served_model=..., size=...)`` starts one more on a free port (not in the
  fleet file) and ``.remove_engine(engine)`` stops it. Engine 0 is the small, fast model on
  the first core, engine 1 the large one, about 3x slower, on the second.
  Before each test that uses it, every engine is made ready again (thawed, restarted if a
  test stopped or killed it), so a test may break engines and leave them broken.
- ``vllm_fleet``: the lab's fleet file, loaded (a :class:`router.config.schema.FleetConfig`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from router.config import load_fleet
from router.config.schema import FleetConfig
from router.lab import Lab, lab_home
from router.lab.vllm import VLLM

RUN_COMMAND = "python3 -m pytest --real-engines tests/real_engines"
_HERE = Path(__file__).resolve().parent
_TIMEOUT_S = 900
"""A guard against hangs only: the first test also waits for the lab (and maybe its build)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=f"needs real vLLM engines; run them with: {RUN_COMMAND}")
    for item in items:
        if _HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.real_engines)
        item.add_marker(pytest.mark.timeout(_TIMEOUT_S))
        if not config.getoption("--real-engines"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The session's two real engines (see the module's docstring)."""
    # Its own run directory: a lab brought up by hand (gpurouter lab vllm up) is left alone.
    lab = Lab.up(VLLM, lab_home(), run_dir=tmp_path_factory.mktemp("vllm-lab"), count=2)
    yield lab
    lab.down()


@pytest.fixture(autouse=True)
def _engines_ready(request: pytest.FixtureRequest) -> None:
    """Before a test that uses the lab: every engine thawed and answering, whatever an
    earlier test did to it."""
    if "vllm_lab" in request.fixturenames:
        lab: Lab = request.getfixturevalue("vllm_lab")
        lab.ensure_ready()


@pytest.fixture
def vllm_fleet(vllm_lab: Lab) -> FleetConfig:
    """The lab's fleet file, loaded."""
    return load_fleet(vllm_lab.fleet_file)
