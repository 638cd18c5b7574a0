"""EmulatedFleet: every replica of a fleet file (or some of them) served from one process.

Each replica listens on the loopback port of its endpoint URL (or on a port given in
``ports``, 0 meaning any free one). Faults are set per replica id through the methods here or
over HTTP on the control listener (router.emulator.control); ``gpu_samples`` reads a node's
emulated GPUs for the telemetry agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from router.config.schema import FleetConfig, NodeConfig, ReplicaConfig
from router.emulator.control import ControlListener
from router.emulator.faults import FaultCommand
from router.emulator.gpu import BusyWindow, GpuLoad, gpu_inventory, gpu_samples
from router.emulator.replica import EmulatedReplica
from router.emulator.versions import DEFAULT_LOAD_S, VersionSwitch
from router.errors import ConfigError, ControlError, Problem
from router.perf.profiles import ProfileCatalog, default_catalog, load_catalog
from router.telemetry.schema import GpuInventory, GpuSample

__all__ = ["EmulatedFleet", "loopback_address"]


def loopback_address(replica: ReplicaConfig) -> tuple[str, int] | str:
    """``(host, port)`` to listen on for ``replica``'s endpoint, or what is wrong with it."""
    try:
        url = urlsplit(replica.endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as exc:
        return f"cannot read the endpoint {replica.endpoint!r}: {exc}"
    host = url.hostname or ""
    if host == "localhost":
        return "127.0.0.1", port
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return (
            f"{replica.endpoint} is not on this machine's loopback; the emulator serves "
            "127.0.0.1, ::1 or localhost only"
        )
    return host, port


class EmulatedFleet:
    """The emulated replicas of one fleet, with their faults and GPU readings."""

    def __init__(
        self,
        config: FleetConfig,
        *,
        replicas: Iterable[str] | None = None,
        time_scale: float = 1.0,
        seed: int = 0,
        catalog: ProfileCatalog | None = None,
        ports: Mapping[str, int] | None = None,
        load_s: float = DEFAULT_LOAD_S,
    ) -> None:
        """``load_s``: emulated seconds a version switch takes to load when its command
        names none (router/emulator/versions.py)."""
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.config = config
        self.time_scale = time_scale
        # The fleet file's own profiles add to (or override) the built-in ones.
        self.catalog = catalog or (
            load_catalog(config.profiles) if config.profiles else default_catalog()
        )
        chosen = _select(config, replicas)
        addresses = _addresses(config, chosen, ports or {})
        self.replicas: Mapping[str, EmulatedReplica] = {
            r.id: EmulatedReplica(
                r, self.catalog, host=host, port=port, time_scale=time_scale, seed=seed
            )
            for r, (host, port) in zip(chosen, addresses, strict=True)
        }
        self._windows: dict[str, BusyWindow] = {}
        self._control: ControlListener | None = None
        self.load_s = load_s
        self._restarts: dict[str, asyncio.Task[None]] = {}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on every replica's port; OSError if one is taken."""
        try:
            for replica in self.replicas.values():
                await replica.start()
                self._windows[replica.id] = BusyWindow(
                    *replica.driver.busy_reading(), self.time_scale
                )
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close every listener and connection; in-flight requests are cancelled."""
        if self._control is not None:
            await self._control.stop()
            self._control = None
        restarts, self._restarts = list(self._restarts.values()), {}
        for task in restarts:
            task.cancel()
        for task in restarts:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for replica in self.replicas.values():
            await replica.stop()

    async def __aenter__(self) -> EmulatedFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start_control(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve the fault API on ``host:port``; the port it listens on."""
        if self._control is None:
            self._control = ControlListener(self)
        return await self._control.start(host, port)

    def replica(self, replica_id: str) -> EmulatedReplica:
        """The replica called ``replica_id``; ControlError if this fleet does not emulate it."""
        try:
            return self.replicas[replica_id]
        except KeyError:
            known = ", ".join(self.replicas)
            raise ControlError(f"no emulated replica {replica_id!r} (known: {known})") from None

    def url(self, replica_id: str) -> str:
        """Base URL the replica answers on."""
        return self.replica(replica_id).url

    # --- faults ---------------------------------------------------------------------------

    async def kill(self, replica_id: str) -> None:
        """Stop listening and drop open connections; the port refuses until revived."""
        await self.replica(replica_id).kill()

    async def revive(self, replica_id: str) -> None:
        """Back to normal (every fault undone), listening again."""
        await self.replica(replica_id).heal()

    async def heal(self, replica_id: str) -> None:
        """Back to normal (every fault undone), listening again."""
        await self.replica(replica_id).heal()

    async def hang(self, replica_id: str) -> None:
        """Accept and read requests, answer nothing until healed."""
        self.replica(replica_id).hang()

    async def freeze(self, replica_id: str) -> None:
        """Stop the engine (no token, nothing admitted) while the server answers on."""
        self.replica(replica_id).freeze()

    async def thaw(self, replica_id: str) -> None:
        """Let a frozen engine step again."""
        self.replica(replica_id).thaw()

    async def slow(self, replica_id: str, factor: float) -> None:
        """Every engine step takes ``factor`` times as long."""
        self.replica(replica_id).slow(factor)

    async def fail_fraction(
        self, replica_id: str, fraction: float, seed: int | None = None
    ) -> None:
        """Answer 500 to ``fraction`` of completion requests, drawn from ``seed``."""
        self.replica(replica_id).fail(fraction, seed)

    async def refuse(self, replica_id: str) -> None:
        """Close the listener only: new connections are refused, open ones carry on."""
        await self.replica(replica_id).refuse()

    async def apply(self, replica_id: str, command: FaultCommand) -> None:
        """Set the fault ``command`` names on the replica."""
        replica = self.replica(replica_id)
        match command.fault:
            case "kill":
                await replica.kill()
            case "refuse":
                await replica.refuse()
            case "hang":
                replica.hang()
            case "freeze":
                replica.freeze()
            case "thaw":
                replica.thaw()
            case "slow":
                replica.slow(command.factor, command.version)
            case "fail":
                replica.fail(command.fraction, command.seed, command.version)
            case "heal" | "revive":
                await replica.heal()

    # --- versions -------------------------------------------------------------------------

    async def switch_version(self, replica_id: str, switch: VersionSwitch) -> None:
        """Start restarting the replica onto ``switch.version``; returns once its port is
        closed, the load going on in the background (as ``systemctl restart`` returns while
        the engine loads). ControlError while it is already restarting."""
        replica = self.replica(replica_id)
        await replica.go_down(switch.version, switch.aliases)
        task = asyncio.create_task(
            replica.come_up(switch.load_s), name=f"emulated-restart-{replica_id}"
        )
        self._restarts[replica_id] = task
        task.add_done_callback(lambda t: self._forget_restart(replica_id, t))

    def _forget_restart(self, replica_id: str, task: asyncio.Task[None]) -> None:
        if self._restarts.get(replica_id) is task:
            del self._restarts[replica_id]

    def versions(self) -> dict[str, dict[str, Any]]:
        """Every replica's served version, and the one a restart is loading (or None)."""
        return {
            rid: {"version": r.model, "aliases": list(r.aliases), "loading": r.loading}
            for rid, r in self.replicas.items()
        }

    def faults(self) -> dict[str, dict[str, Any]]:
        """Every replica's faults, by id."""
        return {rid: r.faults.as_json() for rid, r in self.replicas.items()}

    # --- GPU readings ---------------------------------------------------------------------

    def gpu_samples(self, node: str) -> list[GpuSample]:
        """A reading of every GPU of ``node``, as an NVML sampler would give it.

        Utilization is the busy share since the previous call for the same replica.
        """
        config = self._node(node)
        loads: dict[int, GpuLoad] = {}
        for r in config.replicas:
            replica, window = self.replicas.get(r.id), self._windows.get(r.id)
            if replica is None or window is None:
                continue
            util = window.read(*replica.driver.busy_reading())
            per_gpu = replica.memory_used_bytes() // len(r.gpus)
            for index in r.gpus:
                loads[index] = GpuLoad(r.id, util, per_gpu)
        return gpu_samples(config, loads, self.catalog)

    def gpu_inventory(self, node: str) -> list[GpuInventory]:
        """``node``'s GPUs for the agent's birth message."""
        return gpu_inventory(self._node(node), self.catalog)

    def _node(self, name: str) -> NodeConfig:
        for node in self.config.nodes:
            if node.name == name:
                return node
        raise ControlError(f"no node {name!r} in the fleet")


def _select(config: FleetConfig, wanted: Iterable[str] | None) -> list[ReplicaConfig]:
    if wanted is None:
        return list(config.replicas)
    by_id = {r.id: r for r in config.replicas}
    names = list(dict.fromkeys(wanted))
    unknown = [n for n in names if n not in by_id]
    if unknown:
        source = str(config.source or "fleet")
        known = ", ".join(by_id)
        problems = [
            Problem(source, None, "replica", f"no replica {n!r} (known: {known})") for n in unknown
        ]
        raise ConfigError(problems)
    return [by_id[n] for n in names]


def _addresses(
    config: FleetConfig, replicas: list[ReplicaConfig], ports: Mapping[str, int]
) -> list[tuple[str, int]]:
    """Where each replica listens; ConfigError listing every endpoint that is not loopback."""
    source = str(config.source or "fleet")
    out: list[tuple[str, int]] = []
    problems: list[Problem] = []
    for r in replicas:
        address = loopback_address(r)
        if isinstance(address, str):
            problems.append(Problem(source, None, f"replicas.{r.id}.endpoint", address))
            continue
        out.append((address[0], ports.get(r.id, address[1])))
    if problems:
        raise ConfigError(problems)
    return out
