"""What gpurouter's data plane adds to a request: direct vs through RouterServer vs nginx.

    python bench/bench_proxy.py             # 2 rounds (about 1 minute on 2 cores)
    python bench/bench_proxy.py --quick     # 1 short round (about 20 s)
    python bench/bench_proxy.py --json      # the figures as JSON
    python bench/bench_proxy.py --profile prof.out   # also cProfile the router process

Processes, each on a loopback port the OS picked (the pieces of bench_http_stack.py):

- the **upstream**: a zero-work OpenAI-like server (raw uvloop protocol): a fixed chat
  completion, or for ``"stream": true`` 20 SSE chunks and ``data: [DONE]``;
- **gpurouter**: the real ``RouterServer`` (uvicorn + httptools front door, the core, the
  aiohttp pool, metrics, health) on uvloop, with a fleet of ``--replicas`` replicas that all
  point at the upstream (batch sizes large enough that nothing queues);
- a **bare proxy**: bench_http_stack.py's uvicorn + aiohttp proxy (parse once, forward,
  relay; no routing, no accounting), the floor of what these libraries cost, so that the gap
  between it and gpurouter is the router's own work;
- **nginx** (Debian's ``nginx-light``, one worker): a generated config, upstream keep-alive,
  ``proxy_buffering off``, as the reference for what a C proxy adds; skipped if not installed;
- the **load generator**: closed loop, one keep-alive connection per user, raw HTTP/1.1
  client on uvloop; every reply's status and length is checked.

Each round measures every path at concurrency 1, 32 and 256, streaming and not, in a rotated
order. "Added" latency and the throughput ratio compare with the direct path of the same
round; the table shows medians over rounds. The last column is the proxy's CPU time per
request. Every measurement is bounded (``--quick``: 0.2 s warm-up + 0.5 s, else 0.3 s + 1.0 s,
at most 5,000 requests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import bench_http_stack as stack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONCURRENCIES = stack.CONCURRENCIES
DIRECT, BARE, ROUTER, NGINX = "direct", "bare proxy", "gpurouter", "nginx"


@dataclass
class Settings:
    rounds: int
    warmup: float
    duration: float
    cap: int


FULL = Settings(rounds=2, warmup=0.3, duration=1.0, cap=5000)
QUICK = Settings(rounds=1, warmup=0.2, duration=0.5, cap=2000)


# ---- the router process ------------------------------------------------------------------


def bench_fleet(upstream_port: int, replicas: int) -> Any:
    from router.config.schema import (
        FleetConfig,
        GpuConfig,
        HealthConfig,
        NodeConfig,
        QueueConfig,
        ReplicaConfig,
        RouterConfig,
        ServerConfig,
    )

    model = stack.REQUEST_BODY["model"]
    assert isinstance(model, str)
    gpus = tuple(GpuConfig(i, "A100-80GB", 80.0) for i in range(replicas))
    configs = tuple(
        ReplicaConfig(
            id=f"r{i}",
            node="bench",
            endpoint=f"http://127.0.0.1:{upstream_port}",
            model=model,
            gpus=(i,),
            gpu_model="A100-80GB",
            batch_size=512,
        )
        for i in range(replicas)
    )
    return FleetConfig(
        nodes=(NodeConfig("bench", gpus, configs),),
        cluster="bench",
        model=model,
        router=RouterConfig(
            queue=QueueConfig(size=8192),
            health=HealthConfig(check_interval_s=0, eject_after_failures=0),
        ),
        server=ServerConfig(keepalive_s=60.0),
    )


async def serve_router(upstream_port: int, replicas: int) -> None:
    from router.http.server import RouterServer

    server = RouterServer(
        bench_fleet(upstream_port, replicas), listen="127.0.0.1:0", admin_listen="127.0.0.1:0"
    )
    await server.start()
    stack._announce(int(server.front_url.rsplit(":", 1)[1]))
    await server.serve_forever()


def run_router(upstream_port: int, replicas: int, profile: str | None) -> None:
    import uvloop

    if profile is None:
        uvloop.run(serve_router(upstream_port, replicas))
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        uvloop.run(serve_router(upstream_port, replicas))
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def spawn_router(upstream_port: int, replicas: int, profile: str | None) -> stack.Child:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, env.get("PYTHONPATH")) if p)
    log = tempfile.TemporaryFile()  # noqa: SIM115  # the Child closes it in stop()
    args = ["--role", "router", "--upstream-port", str(upstream_port)]
    args += ["--replicas", str(replicas)] + (["--profile", profile] if profile else [])
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    return stack.Child(ROUTER, proc, log)


# ---- nginx -------------------------------------------------------------------------------

NGINX_CONF = """
worker_processes 1;
daemon off;
master_process on;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream zero {{
{servers}
        keepalive 512;
        keepalive_requests 10000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=2048;
        location / {{
            proxy_pass http://zero;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )


def spawn_nginx(binary: str, upstream_ports: int | Sequence[int], workdir: str) -> stack.Child:
    """nginx, one worker, in front of one upstream port or several (round-robin)."""
    port = stack._free_port()
    user = "user root;" if os.geteuid() == 0 else ""
    ports = [upstream_ports] if isinstance(upstream_ports, int) else list(upstream_ports)
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
    conf = os.path.join(workdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(user=user, dir=workdir, servers=servers, port=port))
    log = tempfile.TemporaryFile()  # noqa: SIM115  # the Child closes it in stop()
    proc = subprocess.Popen(
        [binary, "-p", workdir, "-c", conf, "-e", os.path.join(workdir, "error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    child = stack.Child(NGINX, proc, log)
    child.port = port
    return child


# ---- the run -------------------------------------------------------------------------------


Cell = stack.Cell
"""Per-round samples of one cell and its direct baseline (shared with bench_http_stack)."""


def measure_all(
    load: stack.LoadGenerator, targets: dict[str, stack.Target], settings: Settings
) -> dict[tuple[str, int, bool], Cell]:
    cells: dict[tuple[str, int, bool], Cell] = {}
    grid = [(c, s) for c in CONCURRENCIES for s in (False, True)]
    for r in range(settings.rounds):
        for g, (concurrency, stream) in enumerate(grid):
            samples: dict[str, stack.Sample] = {}
            for name in stack.rotated(list(targets), r * len(grid) + g):
                sample = load.measure(
                    targets[name], stream, concurrency, settings.warmup, settings.duration,
                    settings.cap,
                )  # fmt: skip
                samples[name] = sample
                stack.log(
                    f"  round {r + 1} c={concurrency:<3} stream={stream!s:<5} {name:<10} "
                    f"{sample.rps:8.0f} req/s  p50 {sample.p50_ms:7.3f} ms  "
                    f"p99 {sample.p99_ms:7.3f} ms"
                    + (f"  ERRORS {sample.errors}" if sample.errors else "")
                )
            for name, sample in samples.items():
                cell = cells.setdefault((name, concurrency, stream), Cell())
                cell.samples.append(sample)
                cell.direct.append(samples[DIRECT])
    return cells


def table(cells: dict[tuple[str, int, bool], Cell], names: list[str]) -> list[str]:
    return stack.format_table(cells, names, first_column="path")


def aims(cells: dict[tuple[str, int, bool], Cell]) -> list[str]:
    out = []
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        c1 = cells[(ROUTER, 1, stream)].summary()
        c32 = cells[(ROUTER, 32, stream)].summary()
        met1 = "met" if c1["added_p50_ms"] <= 1.0 else "NOT met"
        met32 = "met" if c32["rps_vs_direct"] >= 0.5 else "NOT met"
        out.append(
            f"aim, {kind}: added p50 at c=1 {c1['added_p50_ms']:+.3f} ms (<= 1 ms: {met1}); "
            f"req/s at c=32 {c32['rps_vs_direct']:.2f} of direct (>= 0.5: {met32})"
        )
    return out


def orchestrate(args: argparse.Namespace) -> int:
    settings = QUICK if args.quick else FULL
    if args.rounds:
        settings = Settings(args.rounds, settings.warmup, settings.duration, settings.cap)
    started = time.monotonic()
    env = stack.environment()
    children: list[stack.Child] = []
    load: stack.LoadGenerator | None = None
    skipped: dict[str, str] = {}
    workdir = tempfile.mkdtemp(prefix="bench-nginx-")
    os.chmod(workdir, 0o755)
    try:
        upstream = stack.spawn("upstream", "--role", "upstream")
        children.append(upstream)
        upstream.port = stack.read_port(upstream)
        stack.probe(upstream.port)
        router = spawn_router(upstream.port, args.replicas, args.profile)
        children.append(router)
        router.port = stack.read_port(router)
        stack.probe(router.port)
        bare = stack.spawn(BARE, "--role", "proxy", "--server", "uvicorn", "--client", "aiohttp",
                           "--upstream-port", str(upstream.port))  # fmt: skip
        children.append(bare)
        bare.port = stack.read_port(bare)
        stack.probe(bare.port)
        targets = {
            DIRECT: stack.Target(upstream.port),
            BARE: stack.Target(bare.port, bare.proc.pid),
            ROUTER: stack.Target(router.port, router.proc.pid),
        }
        binary = find_nginx()
        if binary is None:
            skipped[NGINX] = "nginx is not installed (apt-get install nginx-light)"
        else:
            nginx = spawn_nginx(binary, upstream.port, workdir)
            children.append(nginx)
            try:
                stack.probe(nginx.port, timeout=10)
                targets[NGINX] = stack.Target(nginx.port, nginx.proc.pid)
            except (OSError, RuntimeError) as exc:
                skipped[NGINX] = f"did not start: {exc}: {nginx.log_tail()}"
        load = stack.LoadGenerator()
        cells = measure_all(load, targets, settings)
    finally:
        if load is not None:
            load.stop()
        for child in children:
            child.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    env["loadavg_at_end"] = os.getloadavg()
    names = list(targets)
    errors = sum(cell.summary()["errors"] for cell in cells.values())
    report = {
        "settings": asdict(settings),
        "replicas": args.replicas,
        "elapsed_s": round(time.monotonic() - started, 1),
        "environment": env,
        "skipped": skipped,
        "aims": aims(cells),
        "results": [
            {"path": n, "concurrency": c, "stream": s, **cell.summary()}
            for (n, c, s), cell in cells.items()
        ],
    }
    if args.json:
        print(json.dumps(stack._nan_to_none(report), indent=2))
    else:
        print(
            f"proxy overhead: {settings.rounds} round(s), {settings.duration} s per measurement "
            f"after {settings.warmup} s warm-up, {report['elapsed_s']:.0f} s in all; "
            f"gpurouter with {args.replicas} replicas; Python {env['python']}, "
            f"{env['usable_cpus']} CPUs, load average {env['loadavg_at_start'][0]:.2f} at "
            f"start, {env['loadavg_at_end'][0]:.2f} at end\n"
        )
        print("\n".join(table(cells, names)))
        print()
        print("\n".join(report["aims"]))
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
    if errors:
        stack.log(f"WARNING: {errors} replies were wrong (status or length)")
    return 1 if errors else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument("--replicas", type=int, default=4, help="replicas in gpurouter's fleet")
    parser.add_argument("--profile", metavar="PATH", help="cProfile the router into PATH")
    parser.add_argument("--role", choices=("bench", "router"), default="bench")
    parser.add_argument("--upstream-port", type=int)
    args = parser.parse_args()
    if args.role == "router":
        with contextlib.suppress(KeyboardInterrupt):
            run_router(args.upstream_port, args.replicas, args.profile)
        return 0
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
