"""The routers the benchmarks put in front of an upstream, started as their users start them.

- **gpurouter**: ``gpurouter serve --workers N --no-telemetry`` on a generated fleet file
  (``fleet_yaml``), the real command with its supervisor when N > 1;
- **vllm-router** and **sglang-router**: the Rust routers vLLM and SGLang ship, from their
  wheels in a separate environment under the user's cache directory
  (``gpurouter/bench/rust-routers``), built on first use; never dependencies of gpurouter.

Shared by bench_real_engines.py, bench_token_relay.py and bench_scaling.py so that the
environment, the flags and the readiness rules are written once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
RUST_PACKAGES = ("vllm-router", "sglang-router")


def rust_environment(say: Callable[[str], object]) -> Path | None:
    """The separate environment with the Rust routers' wheels (built once); None if it
    cannot be built (no network, no wheel for this platform)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = base / "gpurouter" / "bench" / "rust-routers"
    if not (root / "bin" / "vllm-router").exists():
        say(f"building the reference routers' environment ({', '.join(RUST_PACKAGES)})")
        done = subprocess.run([sys.executable, "-m", "venv", str(root)], check=False)
        pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", *RUST_PACKAGES]
        if done.returncode or subprocess.run(pip, check=False).returncode:
            return None
    return root


def rust_router_argv(
    kind: str,
    policy: str,
    rust: Path,
    port: int,
    worker_urls: Sequence[str],
    prometheus_port: int | None = None,
) -> list[str]:
    """The command line of ``vllm-router`` or ``sglang-router`` on loopback ``port``.

    Both export Prometheus metrics on port 29000 unless told otherwise, so two of them (or
    a router and anything else there) running at once need ``prometheus_port``."""
    if kind == "vllm-router":
        argv = [str(rust / "bin" / "vllm-router"), "--policy", policy]
    elif kind == "sglang-router":
        # The wheel's console script is a Python launcher of the Rust router; this is the
        # form SGLang's documentation gives.
        argv = [str(rust / "bin" / "python"), "-m", "sglang_router.launch_router"]
        argv += ["--policy", policy]
    else:
        raise ValueError(f"not a Rust router: {kind}")
    argv += ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls]
    if prometheus_port is not None:
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port)]
    return argv


# ---- gpurouter serve ---------------------------------------------------------------------


def fleet_yaml(
    upstream_urls: Sequence[str],
    model: str,
    *,
    batch_size: int = 1024,
    strategy: str | None = None,
) -> str:
    """A fleet file of one replica per upstream URL, for a zero-work upstream: batch sizes
    high enough that nothing queues, and the router's own calls to the replicas (health
    checks, their /metrics and /v1/models) off, so that the CPU measured is the relay's."""
    gpus = "\n".join(
        f"      - {{index: {i}, model: A100-80GB, memory_gib: 80}}"
        for i in range(len(upstream_urls))
    )
    replicas = "\n".join(
        f'      - {{id: r{i}, endpoint: "{url}", gpus: [{i}], batch_size: {batch_size}}}'
        for i, url in enumerate(upstream_urls)
    )
    strategy_line = f"  strategy: {{name: {strategy}}}\n" if strategy else ""
    return f"""cluster: bench
model: {model}
nodes:
  - name: bench
    gpus:
{gpus}
    replicas:
{replicas}
router:
{strategy_line}  queue: {{size: 8192}}
  health:
    check_interval_s: 0
    eject_after_failures: 0
    engine_metrics_interval_s: 0
    models_interval_s: 0
server: {{keepalive_s: 60, shutdown_grace_s: 2}}
"""


def gpurouter_serve_argv(fleet: Path, workers: int) -> list[str]:
    """``gpurouter serve`` as the installed script runs it, on any free loopback port."""
    return [
        sys.executable, "-m", "console.cli", "serve", "--config", str(fleet),
        "--workers", str(workers), "--no-telemetry",
        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
    ]  # fmt: skip


def start_process(argv: Sequence[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """In a session of its own (its workers stop with it), output to ``log``; the project
    root on the path, so that ``-m console.cli`` runs this tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def front_door_port(log_path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """The port ``gpurouter serve`` says its front door is on (its first line of output)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        for line in text.splitlines():
            if line.startswith("front door on "):
                return int(line.rsplit(":", 1)[1].strip().rstrip("/"))
        if proc.poll() is not None:
            raise RuntimeError(f"gpurouter serve exited with {proc.returncode}: {text[-500:]}")
        time.sleep(0.1)
    raise RuntimeError(f"gpurouter serve did not say where its front door is in {timeout:.0f} s")


@dataclass
class Started:
    """A router this run started: stop() ends its whole session."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-600:]
