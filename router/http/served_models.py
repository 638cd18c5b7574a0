"""What each replica serves, learned from its own ``GET /v1/models``.

The fleet file's ``model`` is a declaration; the replica's answer (``data[].id``: every name
it serves, aliases and adapters included) is the fact that routing uses
(``Replica.serves``: the one rule, which the core and every strategy reach through
``Replica.fits``). Each replica is asked:

- at start, before the front door opens (each ask bounded by ``health.check_timeout_s``);
- when it comes back into service: readmitted after an ejection, or undrained;
- every ``health.models_interval_s`` while it is not ejected (0: never; the fleet file is
  then trusted).

A replica that has not answered yet is judged by the fleet file. One that answered keeps its
last answer when a later ask fails: a replica that does not answer is health checking's
business, not a change of model. A replica whose answer leaves out its declared model is
flagged (``Replica.model_mismatch``, logged once per change, shown in the snapshot, the admin
state and ``gpurouter_replica_model_mismatch``).

:class:`ServedModels` also keeps the front door's table, model name -> the replicas that
serve it, rebuilt whenever an answer changes, so a request's model is checked with one dict
lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import orjson

from router.core import CoreListener, RouterCore
from router.errors import UpstreamError
from router.replica import Replica, ReplicaState

__all__ = ["MODELS_PATH", "ModelListError", "ServedModels", "model_table", "parse_model_list"]

log = logging.getLogger("gpurouter.http")

MODELS_PATH = "/v1/models"
MAX_MODELS_BYTES = 1024 * 1024
"""A model list larger than this is refused unread (vLLM's is under a KiB per model)."""


class ModelListError(UpstreamError):
    """A replica's ``/v1/models`` could not be read as an OpenAI model list."""

    title = "model list unreadable"


def parse_model_list(body: bytes) -> tuple[str, ...]:
    """The ``id`` of every entry of an OpenAI model list, in order, each once."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ModelListError(f"not JSON: {exc}") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ModelListError("not a model list: no `data` array")
    names: dict[str, None] = {}
    for entry in entries:
        name = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ModelListError(f"an entry of `data` has no string `id`: {str(entry)[:80]}")
        names[name] = None
    return tuple(names)


def model_table(replicas: list[Replica]) -> dict[str, list[Replica]]:
    """Model name -> the replicas that serve it (``Replica.models``), in pool order."""
    table: dict[str, list[Replica]] = {}
    for r in replicas:
        for model in r.models:
            table.setdefault(model, []).append(r)
    return table


class ServedModels(CoreListener):
    """Asks the replicas what they serve; sets ``Replica.served_models``; keeps the table."""

    def __init__(
        self,
        core: RouterCore,
        *,
        interval_s: float | None = None,
        timeout_s: float | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        health = core.fleet.router.health
        self.core = core
        self.interval_s = health.models_interval_s if interval_s is None else interval_s
        self.timeout = aiohttp.ClientTimeout(
            total=health.check_timeout_s if timeout_s is None else timeout_s
        )
        self.by_model = model_table(core.pool.replicas)
        """Model name -> the replicas that serve it; what the front door checks and lists."""
        self.errors: dict[str, str] = {}
        """Replica id -> why its latest ask failed (absent once one succeeds)."""
        self.answered_at: dict[str, float] = {}
        """Replica id -> when (the core's clock) it last answered."""
        self._session = session
        self._own_session = session is None
        self._asking: dict[int, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        core.listeners.append(self)

    # ---- for the front door ---------------------------------------------------------------

    def replicas_for(self, model: str) -> list[Replica] | None:
        """The replicas that serve ``model``; None when none does."""
        return self.by_model.get(model)

    def names(self) -> list[str]:
        """Every model some replica serves, sorted: the router's ``/v1/models``."""
        return sorted(self.by_model)

    def status(self) -> dict[str, Any]:
        """Per replica: declared and served models, the mismatch, the age of the answer and
        why the latest ask failed, for the admin state."""
        now = self.core.clock()
        out: dict[str, Any] = {}
        for r in self.core.pool:
            at = self.answered_at.get(r.id)
            out[r.id] = {
                "declared": r.config.model,
                "served": None if r.served_models is None else list(r.served_models),
                "mismatch": r.model_mismatch,
                "age_s": None if at is None else now - at,
                "error": self.errors.get(r.id),
            }
        return out

    # ---- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Ask every replica once (each bounded by the timeout), then keep asking in the
        background; does nothing when the interval is 0."""
        if self.interval_s <= 0 or self._task is not None:
            return
        await self.poll_once()
        self._task = asyncio.create_task(self._run(), name="served-models")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._asking.values()) if t is not None]
        self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._asking.clear()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll_once()

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        # Back in service (readmitted or undrained): it may have been restarted with another
        # model meanwhile, so ask now rather than at the next round. Until it answers, its
        # last answer stands.
        back = replica.state is ReplicaState.ACTIVE and old is not ReplicaState.ACTIVE
        if back and self._task is not None:
            self._ask_soon(replica)

    # ---- asking ---------------------------------------------------------------------------

    async def poll_once(self) -> None:
        """Ask every replica in service (not ejected) once, concurrently."""
        asks = [self._ask_soon(r) for r in self.core.pool if r.state is not ReplicaState.EJECTED]
        if asks:
            await asyncio.gather(*asks)

    def _ask_soon(self, replica: Replica) -> asyncio.Task[None]:
        """The replica's ask in progress, or a new one: never two at once to one replica."""
        i = replica.index
        task = self._asking.get(i)
        if task is None or task.done():
            task = asyncio.create_task(self.ask(replica), name=f"served-models-{replica.id}")
            self._asking[i] = task
            task.add_done_callback(
                lambda t: self._asking.pop(i) if self._asking.get(i) is t else None
            )
        return task

    async def ask(self, replica: Replica) -> None:
        """Read the replica's ``/v1/models`` and learn from it; a failure is recorded."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = replica.config.endpoint.rstrip("/") + MODELS_PATH
        try:
            async with self._session.get(url, timeout=self.timeout) as response:
                if response.status != 200:
                    raise ModelListError(f"HTTP {response.status}")
                body = await response.content.read(MAX_MODELS_BYTES + 1)
            if len(body) > MAX_MODELS_BYTES:
                raise ModelListError(f"over {MAX_MODELS_BYTES} bytes")
            names = parse_model_list(body)
        except (aiohttp.ClientError, TimeoutError, ModelListError) as exc:
            self.errors[replica.id] = f"{url}: {str(exc) or type(exc).__name__}"
            return
        self.errors.pop(replica.id, None)
        self.answered_at[replica.id] = self.core.clock()
        self.learn(replica, names)

    def learn(self, replica: Replica, names: tuple[str, ...]) -> bool:
        """Take ``names`` as what the replica serves; returns whether that changed anything.
        A change rebuilds the table and tells the pool, and requests waiting in the queue get
        another look (one may be for a model that is served now)."""
        if replica.served_models == names:
            return False
        before = replica.model_mismatch
        replica.served_models = names
        self.by_model = model_table(self.core.pool.replicas)
        mismatch = replica.model_mismatch
        if mismatch is not None and mismatch != before:
            model = replica.config.model
            log.warning("replica %s %s; it gets none of %s's requests", replica.id, mismatch, model)
        elif mismatch is None and before is not None:
            log.warning("replica %s serves %s again", replica.id, replica.config.model)
        self.core.pool.changed(replica)
        if len(self.core.queue):
            self.core.dispatch()
        return True
