"""A small demo fleet on free loopback ports, and port and process checks, for the demo's
tests (the process checks read /proc)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def two_node_fleet(tmp_path: Path, ports: tuple[int, int]) -> Path:
    """One A100 and one V100 on two nodes, on the given loopback ports."""
    text = f"""\
cluster: demo-test
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: a100-node
    gpus: [{{index: 0, model: A100-80GB, memory_gib: 80}}]
    replicas:
      - {{id: a100-0, endpoint: "http://127.0.0.1:{ports[0]}", gpus: [0], weight: 2.2,
          batch_size: 64, max_context_tokens: 8192, kv_capacity_tokens: 450000}}
  - name: v100-node
    gpus: [{{index: 0, model: V100-32GB, memory_gib: 32}}]
    replicas:
      - {{id: v100-0, endpoint: "http://127.0.0.1:{ports[1]}", gpus: [0], weight: 1.0,
          batch_size: 64, max_context_tokens: 8192, kv_capacity_tokens: 100000}}
router:
  strategy: {{name: least-connections}}
broker: {{url: embedded, sample_period_s: 0.25}}
"""
    path = tmp_path / "fleet.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the fields follow it.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` holds a listening socket on (IPv4 and IPv6, from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed while listed
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            listening = fields[3] == "0A"  # TCP_LISTEN
            if listening and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
