"""One emulated replica: its engine and driver, metrics, faults, and its HTTP listener.

The listener is a socket of our own under aiohttp's runner, so that faults can close it
(``refuse``), close it and drop every connection (``kill``), and open it again on the same port
(``revive``) while the application and the engine live on. Handlers are cancelled when their
client disconnects (aiohttp's ``handler_cancellation``), which cancels their sequence.
"""

from __future__ import annotations

import asyncio
import random
import socket
from dataclasses import dataclass

from aiohttp import web

from router.config.schema import ReplicaConfig
from router.emulator.driver import EngineDriver
from router.emulator.faults import FaultState, check_fault_values
from router.emulator.metrics import ReplicaMetrics
from router.emulator.openai_request import ApiError, CompletionRequest
from router.emulator.tokens import default_output_tokens
from router.errors import ControlError
from router.perf.model import kv_bytes_per_token, weight_bytes
from router.perf.profiles import ProfileCatalog
from router.sim.replica_model import deployment_for, engine_for

__all__ = ["EmulatedReplica", "Job"]

_SHUTDOWN_TIMEOUT_S = 1.0
"""How long stopping waits for handlers after their connections were dropped."""


@dataclass(frozen=True, slots=True)
class Job:
    """How long one accepted request is, and why it will stop."""

    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    """``length`` when it stops at its token limit, ``stop`` when the "model" ends it."""


class EmulatedReplica:
    """A replica of the fleet file, served on ``host:port`` with the performance model."""

    def __init__(
        self,
        config: ReplicaConfig,
        catalog: ProfileCatalog,
        *,
        host: str,
        port: int,
        time_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.deployment = deployment_for(config, catalog)
        self.engine = engine_for(config, catalog)
        self.max_model_len = config.max_context_tokens or self.deployment.model.max_context_tokens
        version = config.version or config.model
        self.model = version
        """The served model name now: the fleet file's ``version`` (else its ``model``), until
        a version switch (``restart``)."""
        self.aliases: tuple[str, ...] = () if version == config.model else (config.model,)
        """More names it serves the model under (vLLM's ``--served-model-name m-v2 m``): a
        replica the fleet file gives a ``version`` also answers to its ``model``."""
        self.loading: str | None = None
        """The version a restart is loading (the port refuses meanwhile); None when serving."""
        self.metrics = ReplicaMetrics(version, self.engine, self.max_model_len, self.deployment)
        self.driver = EngineDriver(self.engine, time_scale=time_scale, observer=self.metrics)
        self.faults = FaultState()
        self.host = host
        self.port = port
        self.seed = seed
        self.answering = asyncio.Event()
        """Clear while the replica hangs."""
        self.answering.set()
        self._lengths = random.Random(f"{seed}:{config.id}:lengths")
        self._failures = random.Random(f"{seed}:{config.id}:failures")
        self._next_aliases: tuple[str, ...] = ()
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # --- requests -------------------------------------------------------------------------

    def plan(self, req: CompletionRequest) -> Job:
        """The request's lengths; ApiError when this replica cannot serve it."""
        if req.model is not None and req.model != self.model and req.model not in self.aliases:
            message = f"The model `{req.model}` does not exist."
            raise ApiError(404, message, param="model")
        if req.refusal is not None:
            raise req.refusal
        prompt, limit = req.prompt_tokens, self.max_model_len
        asked = prompt + (req.max_tokens or 1)
        # As vLLM: max_tokens is to blame when the prompt alone fits, else the input.
        fits = req.max_tokens is not None and prompt < min(limit, self.kv_limit_tokens)
        param = "max_tokens" if fits else "input_tokens"
        if asked > limit:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {asked} tokens ({prompt} in the input, {asked - prompt} in the "
                "completion). Please reduce the length of the prompt or completion."
            )
            raise ApiError(400, message, param=param)
        kv_limit = self.kv_limit_tokens
        if asked > kv_limit:
            message = (
                f"The request needs {asked} tokens of KV cache; this replica's cache holds "
                f"{kv_limit} for one request. Please reduce the length of the prompt or completion."
            )
            raise ApiError(400, message, param=param)
        return self._lengths_of(req, min(limit, kv_limit) - prompt)

    def _lengths_of(self, req: CompletionRequest, room: int) -> Job:
        if req.output_hint is not None:
            wanted = min(req.output_hint, req.max_tokens or req.output_hint)
        elif req.max_tokens is not None:
            wanted = req.max_tokens
        else:
            wanted = default_output_tokens(self._lengths)
        output = min(wanted, room)
        at_limit = output == req.max_tokens or output < wanted
        return Job(req.prompt_tokens, output, "length" if at_limit else "stop")

    @property
    def kv_limit_tokens(self) -> int:
        """Longest request (prompt + output) the KV cache admits on an empty engine."""
        # The engine admits a sequence only if it leaves a watermark of 1% of the cache free.
        capacity = self.engine.kv_capacity
        return capacity - capacity // 100

    def draws_failure(self) -> bool:
        """Whether this request answers 500 (the ``fail`` fault); draws only while failing."""
        fraction = self.faults.fail_fraction if self._version_faults_apply() else 0.0
        return fraction > 0 and self._failures.random() < fraction

    def _version_faults_apply(self) -> bool:
        """``slow`` and ``fail`` set for a version act only while that version is served."""
        return self.faults.of_version in (None, self.model)

    # --- what the GPU shows ---------------------------------------------------------------

    def memory_used_bytes(self) -> int:
        """Weights plus the KV cache in use, over all of the replica's GPUs."""
        model = self.deployment.model
        return weight_bytes(model) + self.engine.kv_used * kv_bytes_per_token(model)

    # --- lifecycle and faults -------------------------------------------------------------

    async def start(self) -> None:
        from router.emulator.app import build_app

        runner = web.AppRunner(
            build_app(self),
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
            access_log=None,
        )
        await runner.setup()
        self._runner = runner
        self.driver.start()
        await self._listen()

    async def stop(self) -> None:
        await self.kill()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.driver.stop()

    async def kill(self) -> None:
        self.faults.killed = True
        await self._unlisten()
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()

    async def refuse(self) -> None:
        self.faults.refusing = True
        await self._unlisten()

    def hang(self) -> None:
        self.faults.hung = True
        self.answering.clear()

    def freeze(self) -> None:
        """The engine stops stepping; the server goes on answering (router/emulator/faults.py)."""
        self.faults.frozen = True
        self.driver.freeze()

    def thaw(self) -> None:
        self.faults.frozen = False
        self.driver.thaw()

    def slow(self, factor: float, version: str | None = None) -> None:
        """``version``: the slowness is that version's: it acts only while it is served."""
        check_fault_values(factor, 0.0)
        self.faults.slow_factor = factor
        self.faults.of_version = version
        self.driver.set_slowdown(factor if self._version_faults_apply() else 1.0)

    def fail(self, fraction: float, seed: int | None = None, version: str | None = None) -> None:
        """``version``: the failures are that version's: they act only while it is served."""
        check_fault_values(1.0, fraction)
        self.faults.fail_fraction = fraction
        self.faults.of_version = version
        chosen = self.seed if seed is None else seed
        self._failures = random.Random(f"{chosen}:{self.id}:failures")

    async def heal(self) -> None:
        """Undo every fault; a killed or refusing replica listens again on its port (unless
        a restart is loading its model: it listens when the load is done)."""
        self.faults = FaultState()
        self.answering.set()
        self.driver.thaw()
        self.driver.set_slowdown(1.0)
        if self._site is None and self._runner is not None and self.loading is None:
            await self._listen()

    async def restart(self, version: str, load_s: float, aliases: tuple[str, ...] = ()) -> None:
        """Restart the engine onto ``version`` (router/emulator/versions.py): ``go_down``,
        then ``come_up`` after ``load_s`` emulated seconds."""
        await self.go_down(version, aliases)
        await self.come_up(load_s)

    async def go_down(self, version: str, aliases: tuple[str, ...] = ()) -> None:
        """The restart's first half: the port closes and every open connection drops now
        (what is in flight is lost, as in a real restart); ``loading`` names ``version``.
        ControlError while a restart is already loading."""
        if self.loading is not None:
            raise ControlError(f"{self.id} is already restarting onto {self.loading}")
        self.loading = version
        self._next_aliases = aliases
        await self.kill()

    async def come_up(self, load_s: float) -> None:
        """The second half: after ``load_s`` emulated seconds the replica listens again,
        serving the version ``go_down`` named, with fresh metrics. Faults of the process
        (kill, refuse, hang, freeze) ended with it; ``slow`` and ``fail``, which stand for
        the card and the version, stay (those set for a version act while it is served)."""
        version = self.loading
        if version is None:
            raise ControlError(f"{self.id} is not restarting")
        try:
            await asyncio.sleep(load_s / self.driver.time_scale)
        except asyncio.CancelledError:
            self.loading = None  # the fleet is stopping: it stays down
            raise
        self.model, self.aliases = version, self._next_aliases
        self.metrics = ReplicaMetrics(version, self.engine, self.max_model_len, self.deployment)
        self.driver.observe(self.metrics)
        kept = self.faults
        self.faults = FaultState(
            slow_factor=kept.slow_factor,
            fail_fraction=kept.fail_fraction,
            of_version=kept.of_version,
        )
        self.driver.set_slowdown(kept.slow_factor if self._version_faults_apply() else 1.0)
        self.answering.set()
        self.driver.thaw()
        self.loading = None
        if self._runner is not None:
            await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family)
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()
        self._site = site

    async def _unlisten(self) -> None:
        site, self._site = self._site, None
        if site is not None:
            await site.stop()
