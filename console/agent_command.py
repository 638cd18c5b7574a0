"""``gpurouter agent``: publish this node's GPUs over MQTT (see docs/telemetry.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
from typing import TYPE_CHECKING, Any, TextIO

from router.errors import GpuRouterError

if TYPE_CHECKING:
    from router.config.schema import FleetConfig
    from router.telemetry.agent import GpuSource, NodeAgent


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        metavar="URL",
        help="mqtt://host[:port] or mqtts://host[:port]; overrides the fleet file's broker",
    )
    p.add_argument(
        "--node", default=socket.gethostname(), help="this node's name (default: host name)"
    )
    p.add_argument("--config", metavar="FLEET.yaml", help="fleet file: GPU -> replica map")
    p.add_argument("--cluster", help="cluster of the topics (default: the fleet file's)")
    p.add_argument(
        "--emulate",
        action="store_true",
        help="publish the fleet file's emulated GPUs for this node instead of reading NVML",
    )
    p.add_argument("--period", type=float, metavar="S", help="seconds between samples")
    p.add_argument("--username", help="broker user name")
    p.add_argument(
        "--password-env", metavar="VAR", help="environment variable holding the password"
    )
    p.add_argument("--ca-file", help="CA bundle of the broker's certificate (mqtts://)")
    p.add_argument("--cert-file", help="client certificate (mqtts://)")
    p.add_argument("--key-file", help="client certificate's key")
    p.add_argument(
        "--no-pcie",
        action="store_true",
        help="skip the PCIe counters (each blocks NVML for 20 ms per GPU)",
    )
    p.add_argument(
        "--once", action="store_true", help="read the GPUs once, print, exit (no broker)"
    )
    p.add_argument("--json", action="store_true", help="with --once: print the payloads as JSON")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here: aiomqtt and NVML are not needed to build the parser.
    from router.config import load_fleet
    from router.telemetry.nvml_sampler import NvmlUnavailableError

    try:
        fleet = load_fleet(args.config) if args.config else None
        if args.period is not None and not 0 < args.period <= 3600:
            raise GpuRouterError(f"--period must be above 0 and at most 3600, got {args.period}")
        period = args.period or (fleet.broker.sample_period_s if fleet else 1.0)
        source = _source(args, fleet, period, err)
        if args.once:
            return _once(args, fleet, source, out)
        agent = _agent(args, fleet, source)
        out.write(f"agent {agent.node}: publishing to {agent.target.url} every {period:g} s\n")
        out.flush()
        asyncio.run(_serve(agent))
    except NvmlUnavailableError as exc:
        err.write(f"gpurouter agent: {exc}; use --emulate --config FLEET.yaml without GPUs\n")
        return 2
    except GpuRouterError as exc:
        err.write(f"gpurouter agent: {exc}\n")
        return 2
    return 0


def _source(
    args: argparse.Namespace, fleet: FleetConfig | None, period: float, err: TextIO
) -> GpuSource:
    """NVML's GPUs; the emulated ones with --emulate, or when NVML is missing and the fleet
    file describes this node."""
    from router.telemetry.agent import EmulatedSource
    from router.telemetry.nvml_sampler import NvmlSampler, NvmlUnavailableError

    if not args.emulate:
        sampler = NvmlSampler(period_s=period, read_pcie=not args.no_pcie)
        try:
            sampler.init()
            return sampler
        except NvmlUnavailableError as exc:
            if fleet is None or all(n.name != args.node for n in fleet.nodes):
                raise
            err.write(f"gpurouter agent: {exc}; publishing the fleet file's emulated GPUs\n")
    if fleet is None:
        raise GpuRouterError("--emulate needs --config FLEET.yaml (the GPUs to emulate)")
    from router.emulator import EmulatedFleet

    node = args.node
    if all(n.name != node for n in fleet.nodes):
        known = ", ".join(n.name for n in fleet.nodes)
        raise GpuRouterError(f"the fleet file names no node {node!r} (known: {known})")
    return EmulatedSource(EmulatedFleet(fleet), period_s=period)


def _once(
    args: argparse.Namespace, fleet: FleetConfig | None, source: GpuSource, out: TextIO
) -> int:
    from router.telemetry.agent import agent_version, node_replicas
    from router.telemetry.schema import as_json, encode

    replica_map, models = node_replicas(fleet, args.node) if fleet else ({}, ())
    source.init()
    try:
        status = source.birth(args.node, 0, agent_version(), models)
        batch = source.sample(args.node, 0, 0, replica_map)
    finally:
        source.shutdown()
    if not args.json:
        entries: list[dict[str, Any]] = as_json(batch)["gpus"]  # type: ignore[assignment]
        for entry in entries:
            out.write(_gpu_line(entry) + "\n")
        return 0
    report: dict[str, Any] = {
        "status": as_json(status),
        "gpus": as_json(batch),
        "payload_bytes": {"status": len(encode(status)), "gpus": len(encode(batch))},
    }
    errors = getattr(source, "field_errors", None)
    if errors:
        report["unread_fields"] = {str(i): e for i, e in errors.items() if e}
    out.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0


def _gpu_line(entry: dict[str, Any]) -> str:
    keys = ("name", "replica", "gpu_util_pct", "fb_used_mib", "fb_total_mib", "power_w", "temp_c")
    shown = "  ".join(f"{k}={entry[k]}" for k in keys if k in entry)
    return f"gpu {entry['index']}: {shown}" + ("  LOST" if entry.get("lost") else "")


def _agent(args: argparse.Namespace, fleet: FleetConfig | None, source: GpuSource) -> NodeAgent:
    from router.config.schema import BrokerConfig
    from router.telemetry.agent import NodeAgent, node_replicas
    from router.telemetry.connection import resolve_target

    config = fleet.broker if fleet else BrokerConfig()
    if args.broker is None and config.url == "embedded":
        raise GpuRouterError("give --broker URL (the embedded broker lives in the router)")
    target = resolve_target(
        config,
        url=args.broker,
        username=args.username,
        password_env=args.password_env,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
    )
    replica_map, models = node_replicas(fleet, args.node) if fleet else ({}, ())
    cluster = args.cluster or (fleet.cluster if fleet else "default")
    return NodeAgent(
        args.node, source, target=target, cluster=cluster, replica_map=replica_map, models=models
    )


async def _serve(agent: NodeAgent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop)
    try:
        await agent.run()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
