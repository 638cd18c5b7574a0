"""A router whose port is taken says which listener, where, and the flag that moves it; and
``--listen HOST:0`` moves the admin API to a free port too."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from console.cli import main
from console.listen_options import admin_address
from router.config import load_fleet

ROOT = Path(__file__).resolve().parents[1]

FLEET = """\
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: node
    gpus: [{{index: 0, model: A100-80GB, memory_gib: 80}}]
    replicas:
      - {{id: solo, endpoint: "http://127.0.0.1:9", gpus: [0]}}
router:
  health: {{check_interval_s: 0}}
server: {{listen: "127.0.0.1:{front}", admin_listen: "127.0.0.1:{admin}"}}
"""


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def fleet_file(tmp_path: Path, front: int, admin: int) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.format(front=front, admin=admin))
    return path


@pytest.mark.parametrize(
    ("listener", "flag", "setting"),
    [
        ("admin API", "--admin-listen", "server.admin_listen"),
        ("front door", "--listen", "server.listen"),
    ],
)
def test_a_taken_port_names_the_listener_and_the_flag_that_moves_it(
    tmp_path: Path,
    taken: int,
    capsys: pytest.CaptureFixture[str],
    listener: str,
    flag: str,
    setting: str,
) -> None:
    ports = {"front": 0, "admin": 0} | {"admin" if flag == "--admin-listen" else "front": taken}
    code = main(["serve", "--config", str(fleet_file(tmp_path, **ports))])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        f"gpurouter serve: the {listener} cannot listen on 127.0.0.1:{taken}: Address already "
        f"in use (is another gpurouter running?); move it with {flag} HOST:PORT or {setting} "
        "in the fleet file (port 0 takes a free one)\n"
    )


def test_listen_on_port_0_moves_the_admin_api_to_a_free_port_on_its_own_host(
    tmp_path: Path,
) -> None:
    fleet = load_fleet(fleet_file(tmp_path, 8000, 8001))

    def admin(listen: str | None, admin_listen: str | None = None) -> str | None:
        return admin_address(argparse.Namespace(listen=listen, admin_listen=admin_listen), fleet)

    assert admin("127.0.0.1:0") == "127.0.0.1:0"
    assert admin("0.0.0.0:0") == "127.0.0.1:0"  # the admin API stays where the file puts it
    assert admin("127.0.0.1:0", "127.0.0.1:9001") == "127.0.0.1:9001"  # as asked
    assert admin("127.0.0.1:8100") is None  # a fixed port moves only the front door
    assert admin(None) is None


def test_serve_with_listen_port_0_starts_beside_a_router_holding_the_admin_port(
    tmp_path: Path, taken: int
) -> None:
    """The fleet file's admin port is taken: `--listen 127.0.0.1:0` alone still starts."""
    config = fleet_file(tmp_path, 8000, taken)
    with subprocess.Popen(
        [sys.executable, "-m", "console.cli", "serve", "--workers", "1", "--config", str(config),
         "--listen", "127.0.0.1:0"],
        cwd=ROOT, text=True,
        # Signed control: a router without a secret warns on stderr, by design.
        env={**os.environ, "PYTHONPATH": str(ROOT), "GPUROUTER_CONTROL_SECRET": "s" * 32},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            front = proc.stdout.readline()
            admin = proc.stdout.readline()
            # An answer means serve_forever runs, whose handler makes SIGTERM a clean stop.
            assert httpx.get(admin.split()[-1] + "/admin/state", timeout=10).status_code == 200
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert (proc.returncode, err) == (0, "")
    assert front.startswith("front door on http://127.0.0.1:")
    assert admin.startswith("admin API on http://127.0.0.1:")
    assert int(admin.rsplit(":", 1)[1]) not in (taken, 0)
