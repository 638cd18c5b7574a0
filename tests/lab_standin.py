"""A harmless stand-in for an engine's process tree (no tests here), for the lab's process
mechanics only: an "API server" answering ``/health`` on its port, which starts a child that
calls itself ``STANDIN::EngineCore``, as vLLM's API server starts ``VLLM::EngineCore``.
Real engines are tested with real vLLM in tests/real_engines/."""

from __future__ import annotations

import sys
from pathlib import Path

from router.lab import (
    Engine,
    EngineKind,
    EngineRecord,
    Lab,
    LabEnvironment,
    ServeOptions,
    free_port,
    wait_ready,
)
from router.lab.state import LabState, save_state

__all__ = ["CORE_TITLE", "standin_engine", "standin_environment", "standin_kind", "standin_lab"]

READY_S = 60.0
"""A guard against hangs: the stand-in answers within a fraction of a second."""

CORE_TITLE = "STANDIN::EngineCore"

_LAUNCHER = f"""\
import http.server, subprocess, sys

port = int(sys.argv[1])
if port == 0:
    print("Traceback (most recent call last):", flush=True)
    print("ValueError: the stand-in was told to fail", flush=True)
    sys.exit(1)
code = "import time; time.sleep(3600)"
subprocess.Popen([{CORE_TITLE!r}, "-c", code], executable=sys.executable)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def standin_kind() -> EngineKind:
    """An engine kind whose "engine" is the stand-in above; it installs nothing."""
    return EngineKind(
        name="standin",
        packages=(),
        remove_after=(),
        launcher=_LAUNCHER,
        check=(),
        serve_args=lambda _model_dir, _name, port, _options: [str(port)],
        serve_env=lambda _core, _options: {},
        core_title=CORE_TITLE,
    )


def standin_environment(root: Path) -> LabEnvironment:
    """An environment of the stand-in kind at ``root``, using this Python (no venv made)."""
    kind = standin_kind()
    (root / "bin").mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    (root / "launch.py").write_text(kind.launcher)
    return LabEnvironment(kind, root, 0.0, "stand-in")


def standin_engine(environment: LabEnvironment, name: str, port: int, log_dir: Path) -> Engine:
    """An engine of the stand-in kind on core 0 (port 0: one that fails at start)."""
    record = EngineRecord(
        name=name,
        port=port,
        core=0,
        model_dir=str(log_dir),
        served_model="standin",
        log=str(log_dir / f"{name}.log"),
    )
    return Engine(record, environment, ServeOptions())


def standin_lab(environment: LabEnvironment, run_dir: Path, count: int, kind: str = "") -> Lab:
    """``count`` stand-in engines, started and ready, recorded in ``run_dir`` as a lab of
    ``kind`` (default: the stand-in's) would be."""
    engines = [standin_engine(environment, f"s-{i}", free_port(), run_dir) for i in range(count)]
    state = LabState(kind or environment.kind.name, ServeOptions(), str(run_dir / "fleet.yaml"))
    state.engines = [engine.record for engine in engines]
    lab = Lab(environment, state, run_dir, run_dir)
    for engine in lab.engines:
        engine.start()
    save_state(run_dir, state)
    wait_ready(lab.engines, READY_S)
    return lab
