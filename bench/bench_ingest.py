"""Telemetry ingest: GPU samples per second the router's subscriber applies, and payload sizes.

    python bench/bench_ingest.py             # the table
    python bench/bench_ingest.py --quick     # fewer messages (a smoke run)

The fleet: 64 nodes of 8 H100s, one replica per GPU (512 GPUs). Each message is one node's
8-GPU batch as a real agent writes it (every NVML field, one process per GPU).

Rows:

- ``decode only``: ``decode_gpus`` on each payload, the validation alone;
- ``decode + apply``: ``TelemetrySubscriber.handle`` (topic check, size check, decode, sequence
  accounting, per-replica telemetry), no broker: the subscriber's own ceiling on one core;
- ``end to end via <broker>``: a publisher process offers the aim's rate (2,500 batches/s =
  20,000 GPU samples/s, QoS 0 as agents send) through a broker on loopback to a subscriber
  in this process; samples/s is over the wall time from first to last arrival (bounded by
  what the publisher manages to offer on a busy machine), ``per CPU-s`` divides the samples
  by this process's CPU time (the subscriber, plus the broker when it runs in this event
  loop), and ``CPU share`` is that CPU time over the wall time. The brokers: Mosquitto
  (where installed), the embedded amqtt in its own process (the default), and amqtt in the
  subscriber's event loop (what the design measured against).

``x aim`` compares samples per CPU-second (one core) with the aim, 20,000; ``arrived`` says
how many sent messages were applied (QoS 0 may drop under overload).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from router.config.schema import (
    BrokerConfig,
    FleetConfig,
    GpuConfig,
    NodeConfig,
    ReplicaConfig,
)
from router.core import RouterCore
from router.telemetry.connection import resolve_target
from router.telemetry.embedded_broker import EmbeddedBroker
from router.telemetry.schema import GpuBatch, GpuSample, ProcessInfo, decode_gpus, encode
from router.telemetry.subscriber import TelemetrySubscriber
from router.telemetry.topics import Topics

AIM = 20_000
RATE = AIM / 8
"""Messages per second the publisher offers: the aim, in 8-GPU batches."""
NODES = 64
GPUS = 8
CLUSTER = "bench"
TOPICS = Topics(CLUSTER)


def make_fleet() -> FleetConfig:
    nodes = []
    for n in range(NODES):
        name = f"node-{n}"
        gpus = tuple(GpuConfig(i, "H100-SXM", 80.0) for i in range(GPUS))
        replicas = tuple(
            ReplicaConfig(
                id=f"{name}-r{i}",
                node=name,
                endpoint=f"http://10.0.{n}.1:{8000 + i}",
                model="m",
                gpus=(i,),
                gpu_model="H100-SXM",
            )
            for i in range(GPUS)
        )
        nodes.append(NodeConfig(name, gpus, replicas))
    return FleetConfig(nodes=tuple(nodes), cluster=CLUSTER, broker=BrokerConfig())


def nvml_batch(node: str, seq: int, session: int = 1) -> GpuBatch:
    """An 8-GPU batch with every field a real H100 reports (docs/readings)."""
    gpus = tuple(
        GpuSample(
            index=i,
            uuid=f"GPU-228d2ebe-8a85-b43f-752c-195faa5b33{i:02d}",
            name="NVIDIA H100 80GB HBM3",
            gpu_util_pct=87,
            mem_util_pct=41,
            fb_used_mib=71230,
            fb_total_mib=81559,
            power_w=512.349,
            power_limit_w=700.0,
            temp_c=63,
            sm_clock_mhz=1980,
            pcie_tx_kib_s=2067,
            pcie_rx_kib_s=542,
            replica=f"{node}-r{i}",
            processes=(ProcessInfo(pid=4242 + i, used_mib=70750),),
        )
        for i in range(GPUS)
    )
    return GpuBatch(node, session, seq, 1.7e9 + seq, 1.0, gpus)


def payloads(count: int) -> list[tuple[str, bytes]]:
    """``count`` messages, round-robin over the nodes, seq growing per node."""
    templates = [(f"node-{n}", encode(nvml_batch(f"node-{n}", 0))) for n in range(NODES)]
    out = []
    for k in range(count):
        node, template = templates[k % NODES]
        seq = k // NODES
        out.append((TOPICS.gpus(node), template.replace(b'"seq":0,', b'"seq":%d,' % seq, 1)))
    return out


@dataclass
class Row:
    name: str
    samples_per_s: float
    per_cpu_s: float | None = None
    arrived: str = ""
    cpu_share: float | None = None
    """This process's CPU time over the wall time, while the messages arrived."""


def bench_offline(messages: list[tuple[str, bytes]]) -> list[Row]:
    for _, payload in messages[:500]:  # warm up
        decode_gpus(payload)
    t0 = time.perf_counter()
    for _, payload in messages:
        decode_gpus(payload)
    decode_s = time.perf_counter() - t0
    fleet = make_fleet()
    sub = TelemetrySubscriber(fleet, RouterCore(fleet), broker="mqtt://127.0.0.1:1883")
    t0 = time.perf_counter()
    for topic, payload in messages:
        sub.handle(topic, payload)
    apply_s = time.perf_counter() - t0
    status = sub.status()
    assert status.dropped == 0, status  # every message must have been applied, not dropped
    assert sum(n.samples for n in status.nodes) == len(messages)
    n = len(messages) * GPUS
    return [Row("decode only", n / decode_s), Row("decode + apply (no broker)", n / apply_s)]


async def bench_broker(name: str, url: str, count: int) -> Row:
    fleet = make_fleet()
    core = RouterCore(fleet)
    sub = TelemetrySubscriber(fleet, core, broker=resolve_target(fleet.broker, url=url))
    await sub.start()
    try:
        await _until(lambda: sub.status().broker == "connected", 10)
        await asyncio.sleep(0.2)  # subscriptions settle
        cpu0, wall0 = time.process_time(), time.perf_counter()
        first: list[float] = []
        publisher = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--publish", url, "--count", str(count), "--rate", str(RATE)
        )

        def received() -> int:
            got = sum(n.samples for n in sub.status().nodes)
            if got and not first:
                first.append(time.perf_counter())
            return got

        last, last_change = -1, time.perf_counter()
        while True:
            got = received()
            if got >= count:
                break
            if got != last:
                last, last_change = got, time.perf_counter()
            elif time.perf_counter() - last_change > 3.0 and publisher.returncode is not None:
                break  # nothing more is coming: the rest was dropped
            await asyncio.sleep(0.005)
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        await publisher.wait()
        got = received()
        start = first[0] if first else wall0
        samples = got * GPUS
        return Row(
            f"end to end via {name}",
            samples / max(end - start, 1e-9),
            samples / max(cpu, 1e-9),
            f"{got}/{count}",
            cpu / max(end - wall0, 1e-9),
        )
    finally:
        await sub.stop()


async def _until(condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the subscriber did not connect")
        await asyncio.sleep(0.01)


async def publish(url: str, count: int, rate: float) -> None:
    """The publisher process: ``count`` batches, QoS 0, at ``rate`` messages per second
    (sent in 10 ms slices, behind schedule means sent at once)."""
    from router.telemetry.connection import make_client

    target = resolve_target(BrokerConfig(), url=url)
    messages = payloads(count)
    start = time.perf_counter()
    async with make_client(target, identifier="bench-publisher", max_queued_outgoing=None) as c:
        for k, (topic, payload) in enumerate(messages):
            due = start + k / rate
            if k % max(1, int(rate / 100)) == 0 and due > time.perf_counter():
                await asyncio.sleep(due - time.perf_counter())
            await c.publish(topic, payload, qos=0)
        await asyncio.sleep(0.5)  # let the socket drain before disconnecting


async def bench_brokers(count: int) -> list[Row]:
    rows = []
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if os.access(mosquitto, os.X_OK):
        port = _free_port()
        conf = f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
            f.write(conf)
            conf_path = f.name
        proc = subprocess.Popen([mosquitto, "-c", conf_path], stderr=subprocess.DEVNULL)
        try:
            await asyncio.sleep(0.3)
            rows.append(await bench_broker("Mosquitto", f"mqtt://127.0.0.1:{port}", count))
        finally:
            proc.terminate()
            proc.wait()
            os.unlink(conf_path)
    async with EmbeddedBroker() as broker:
        rows.append(await bench_broker("amqtt, own process", broker.url, count))
    async with EmbeddedBroker(in_process=True) as broker:
        rows.append(await bench_broker("amqtt, same event loop", broker.url, count))
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sizes() -> list[tuple[str, int]]:
    from router.config import load_fleet
    from router.emulator import EmulatedFleet
    from router.telemetry.agent import EmulatedSource

    nvml = len(encode(nvml_batch("gpu-node-07", 3071, session=1_795_430_743_829)))
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "fleets")
    fleet = load_fleet(os.path.join(example, "mixed-a100-v100.yaml"))
    source = EmulatedSource(EmulatedFleet(fleet))
    emulated = source.sample("a100-node", 1_795_430_743_829, 3071, None)
    four = len(encode(emulated))
    return [
        ("8 GPUs, every NVML field, one process each", nvml),
        ("4 emulated GPUs (the demo fleet's a100-node)", four),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages")
    parser.add_argument("--publish", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=RATE, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        asyncio.run(publish(args.publish, args.count, args.rate))
        return 0
    offline_n = 5_000 if args.quick else 40_000
    e2e_n = int(RATE * (1 if args.quick else 6))
    print(
        f"machine: {platform.processor() or platform.machine()}, nproc {os.cpu_count()}, "
        f"load {os.getloadavg()[0]:.2f}, Python {platform.python_version()}"
    )
    print(f"fleet: {NODES} nodes x {GPUS} GPUs; one message = one node's {GPUS}-GPU batch\n")
    rows = bench_offline(payloads(offline_n))
    rows += asyncio.run(bench_brokers(e2e_n))
    print(f"| path | GPU samples/s | per CPU-s | x aim ({AIM:,}/s) | CPU share | arrived |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        per_cpu = r.per_cpu_s if r.per_cpu_s is not None else r.samples_per_s
        share = "1 core" if r.cpu_share is None else f"{100 * r.cpu_share:.0f}%"
        cells = [r.name, f"{r.samples_per_s:,.0f}", f"{per_cpu:,.0f}", f"{per_cpu / AIM:.2f}"]
        print("| " + " | ".join([*cells, share, r.arrived or "-"]) + " |")
    print("\n| payload | bytes | bytes per GPU |")
    print("|---|---|---|")
    for name, size in sizes():
        gpus = GPUS if name.startswith("8") else 4
        print(f"| {name} | {size:,} | {size / gpus:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
