"""The admin API: the router's state and the control surface over HTTP, on its own listener.

- ``GET /admin/state``: the fleet snapshot as JSON, plus ``health`` and (when known)
  ``telemetry``, ``engine_metrics`` (poll errors and values refused as nonsense) and
  ``served_models`` (per replica: declared and served models, the mismatch, the answer's
  age, why the latest ask failed). ``?running=1`` adds ``running``: per replica, the
  requests on it (id, priority, streaming), what an attached console's confirmations count.
- ``GET /admin/fleet``: what the fleet file says of the fleet's shape: cluster, model, the
  nodes with their GPUs and replicas, and the console's settings (theme, refresh, keys); an
  attached console draws its table from it. Secrets (broker, server) are not in it.
- ``POST /admin/commands``: one control command (``{"command": "drain", "replica": "x"}``);
  answers the audit event: 200 applied, 409 refused; 400 when it cannot be read. Where the
  router runs a control link (``gpurouter serve``), the command is published as the
  cluster's desired state and the answer is this router's application of it, once it came
  back from the broker (504 if it did not in 5 s); every router of the cluster applies it.
- ``GET /admin/events``: the audit trail (``?since=SEQ``); ``?follow=1`` keeps streaming new
  events as SSE, or as JSON lines with ``?format=jsonl``. Events are numbered from 1 in each
  run of the router: the answer names its run (``run`` in the JSON, the ``X-Gpurouter-Run``
  header on a stream, ``run`` in ``/admin/state`` too), and ``?run=RUN`` says which run
  ``since`` counts in: a router in another run (it restarted) answers its whole trail.
- ``GET /admin/decisions``: recent routing decisions with their explanations (``?limit=N``;
  ``?replica=ID``: only those that chose that replica).
- ``GET /admin/rollout``: the current (or last) model rollout's state and progress,
  ``{"rollout": ...}`` (null before the first). ``POST /admin/rollout``:
  ``{"action": "start", "version": "org/model-v2", "settings": {...}}`` starts one (settings:
  the keys of the fleet file's ``rollout:``, over it; ``order`` may also be a list of
  replica ids), ``{"action": "pause" | "resume" | "abort" | "rollback"}`` steers it; answers
  its state: 200, 409 refused (one already going, a floor that cannot be kept, a step out of
  turn), 400 when it cannot be read (a bad setting names its key). ``{"action": "preview",
  "version", "settings"}`` answers ``{"preview": ...}``, the plan and the simulator's
  prediction, starting nothing (refused as a start would be). docs/rollouts.md.
- ``GET /admin/split``: the canary's or blue-green set's traffic split, ``{"split": ...}``
  (null when there is none). ``POST /admin/split``: ``{"action": "canary", "version": ...,
  "replicas": [...], "manual": false, "settings": {...}}`` starts a canary; ``{"action":
  "step", "percent": 25}``, ``"promote"``, ``"abort"`` steer it; ``"switch"``, ``"switch
  back"``, ``"release"`` steer the fleet file's blue-green set. 200 with the split's state,
  409 refused, 400 unreadable.

When a token is set every request needs ``Authorization: Bearer <token>`` (the scheme in any
case): none answers 401, a wrong one 403 (compared in constant time). A fleet file whose
``server.admin_token_env`` names a variable that is not set is a configuration error: the
admin API is never served open by mistake. The actor recorded in the audit trail is the
``X-Actor`` header, or ``admin``.

Every answer is counted on the front door's /metrics, by route, status and reason
(router/http/responses.py), in the metrics registered on the core unless others are given; the
admin API's telemetry source feeds them too, when they have none.

What a browser could forge is refused before anything else (router/http/browser_guard.py):
on loopback, a ``Host`` or ``Origin`` that names another host or port answers 403; a command
whose ``Content-Type`` is not ``application/json`` answers 415.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import orjson

from router.config.schema import FleetConfig
from router.control import Applied, Command, ControlSurface, Event, parse_command
from router.core import RouterCore
from router.errors import ConfigError, ControlError, Problem, RolloutError
from router.http.asgi import (
    ClientGoneError,
    CountedSend,
    Receive,
    Scope,
    Send,
    header_map,
    note_reason,
    read_body,
    send_error,
    send_json,
)
from router.http.browser_guard import foreign_host, unsupported_media
from router.http.errors import HttpError, bad_request
from router.http.health import HealthMonitor
from router.http.metrics import RouterMetrics
from router.http.responses import OTHER_ADMIN_ROUTE
from router.in_flight import in_flight
from router.rollout.manager import ACTIONS, RolloutManager
from router.rollout.splits import SPLIT_ACTIONS
from router.rollout.templates import VERSION_NAME
from router.telemetry.status import EngineMetricsStatus, TelemetryStatus

__all__ = ["RUN_HEADER", "AdminApi", "admin_token", "fleet_shape", "token_refusal"]

MAX_COMMAND_BYTES = 65536
RUN_HEADER = b"x-gpurouter-run"
"""Names the run an event stream's numbers count in (the control surface's ``run``)."""
ROUTES = frozenset(
    (
        "/admin/state",
        "/admin/fleet",
        "/admin/commands",
        "/admin/events",
        "/admin/decisions",
        "/admin/rollout",
        "/admin/split",
    )
)


class AdminApi:
    def __init__(
        self,
        core: RouterCore,
        control: ControlSurface,
        health: HealthMonitor,
        *,
        token: str | None = None,
        telemetry: Callable[[], TelemetryStatus] | None = None,
        engine_metrics: Callable[[], EngineMetricsStatus] | None = None,
        served_models: Callable[[], dict[str, Any]] | None = None,
        metrics: RouterMetrics | None = None,
        private: bool = False,
        rollouts: RolloutManager | None = None,
    ) -> None:
        """``token``: the bearer token; when None, the one ``server.admin_token_env`` names, if
        it names one (ConfigError when that variable is not set). ``metrics``: where answers
        are counted; by default the metrics registered on ``core``, if any. ``private``: no
        token at all, for a worker's own admin API on a socket only its service can open
        (router/workers/worker.py): the service's admin API checked the caller's.
        ``rollouts``: where ``/admin/rollout`` goes; without one it answers 404."""
        self.core = core
        self.control = control
        self.health = health
        self.telemetry = telemetry
        self.engine_metrics = engine_metrics
        self.served_models = served_models
        self.rollouts = rollouts
        self.apply: Callable[[Command, str], Awaitable[Applied]] = self._apply_here
        """How a command given here is applied: on this router (the default), or published
        as the cluster's desired state where a control link runs (``gpurouter serve``)."""
        if token is None and not private:
            token = admin_token(core.fleet)
        self._token = None if token is None or private else token.encode()
        self._followers: set[asyncio.Queue[Event | None]] = set()
        self.metrics = metrics if metrics is not None else RouterMetrics.of(core)
        if self.metrics is not None and self.metrics.telemetry is None:
            self.metrics.telemetry = telemetry  # its drops go on /metrics too

    def close_streams(self) -> None:
        """End every ``follow`` stream (the server is stopping)."""
        for queue in self._followers:
            queue.put_nowait(None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        counted = CountedSend(send)
        try:
            await self._serve(scope, receive, counted)
        finally:
            if self.metrics is not None:
                path = scope["path"]
                route = path if path in ROUTES else OTHER_ADMIN_ROUTE
                self.metrics.responses.count(route, counted, error_reason="error")

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = header_map(scope)
        forged = foreign_host(scope, headers)
        if forged is not None:
            await send_error(send, forged)
            return
        refusal = self._refusal(headers)
        if refusal is not None:
            await send_error(send, refusal, [(b"www-authenticate", b"Bearer")])
            return
        route = (scope["method"], scope["path"])
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        try:
            match route:
                case ("GET", "/admin/state"):
                    await send_json(send, 200, self.state(running=_flag(query, "running")))
                case ("GET", "/admin/fleet"):
                    await send_json(send, 200, fleet_shape(self.core.fleet))
                case ("POST", "/admin/commands"):
                    await self._command(receive, send, headers)
                case ("GET", "/admin/events"):
                    await self._events(receive, send, query)
                case ("GET", "/admin/rollout"):
                    await send_json(send, 200, {"rollout": self._rollouts().status()})
                case ("POST", "/admin/rollout"):
                    await self._rollout(receive, send, headers)
                case ("GET", "/admin/split"):
                    await send_json(send, 200, {"split": self._rollouts().splits.status()})
                case ("POST", "/admin/split"):
                    await self._split(receive, send, headers)
                case ("GET", "/admin/decisions"):
                    limit = _int(query, "limit", self.core.settings.decision_log_size)
                    decisions = list(self.core.decisions)
                    if "replica" in query:
                        decisions = [d for d in decisions if d.chosen == query["replica"]]
                    decisions = decisions[-limit:] if limit > 0 else []
                    await send_json(
                        send, 200, {"decisions": [dataclasses.asdict(d) for d in decisions]}
                    )
                case _:
                    await send_error(
                        send, HttpError(404, f"no route {scope['path']}", code="not_found")
                    )
        except HttpError as exc:
            await send_error(send, exc)
        except ClientGoneError:
            note_reason(send, "client_gone")

    def _refusal(self, headers: dict[str, str]) -> HttpError | None:
        return token_refusal(self._token, headers)

    def state(self, *, running: bool = False) -> dict[str, Any]:
        """The snapshot as a dict, with the health monitor's view, the telemetry feed, the
        engine metrics' poll status and what each replica said it serves; ``running``: and
        the requests on each replica."""
        data = self.core.snapshot().to_dict()
        data["run"] = self.control.run
        if running:
            data["running"] = {
                r.id: [dataclasses.asdict(i) for i in in_flight(self.core, r)]
                for r in self.core.pool
            }
        data["health"] = self.health.status()
        if self.telemetry is not None:
            data["telemetry"] = dataclasses.asdict(self.telemetry())
        if self.engine_metrics is not None:
            data["engine_metrics"] = dataclasses.asdict(self.engine_metrics())
        if self.served_models is not None:
            data["served_models"] = self.served_models()
        return data

    async def _command(self, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        data = await self._json_body(receive, headers, "a JSON object with a `command`")
        try:
            command = parse_command(data)
        except ControlError as exc:
            raise HttpError(400, str(exc), code="invalid_command") from None
        try:
            applied = await self.apply(command, headers.get("x-actor") or "admin")
        except TimeoutError:
            raise HttpError(
                504,
                "the command was published but did not come back from the broker in time",
                "server_error",
                code="not_applied",
            ) from None
        event = applied.event
        if not event.ok:
            note_reason(send, "command_refused")
        answer = event.to_dict()
        if applied.routers is not None:
            answer["applied_by"] = dict(applied.routers)
        await send_json(send, 200 if event.ok else 409, answer)

    def _rollouts(self) -> RolloutManager:
        if self.rollouts is None:
            raise HttpError(404, "this router runs no rollouts", code="not_found")
        return self.rollouts

    async def _rollout(self, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        manager = self._rollouts()
        data = await self._json_body(receive, headers)
        action, actor = data.get("action"), headers.get("x-actor") or "admin"
        preview = None
        try:
            if action == "start":
                version, settings = _rollout_start(data)
                manager.start(version, settings, actor)
            elif action == "preview":
                version, settings = _rollout_start(data)
                preview = await manager.preview(version, settings)
            elif action in ACTIONS:
                if set(data) - {"action"}:
                    raise bad_request(f"`{action}` takes no other key than `action`")
                await manager.act(str(action), actor)
            else:
                known = ", ".join(ACTIONS)
                raise bad_request(f"`action` must be one of {known}", "action")
        except ConfigError as exc:
            raise bad_request("; ".join(f"{p.key}: {p.message}" for p in exc.problems)) from None
        except RolloutError as exc:
            note_reason(send, "command_refused")
            raise HttpError(409, str(exc), code="rollout_refused") from None
        if preview is not None:
            await send_json(send, 200, {"preview": preview.to_dict()})
            return
        await send_json(send, 200, {"rollout": manager.status()})

    async def _split(self, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        splits = self._rollouts().splits
        data = await self._json_body(receive, headers)
        action, actor = data.get("action"), headers.get("x-actor") or "admin"
        if action not in SPLIT_ACTIONS:
            raise bad_request(f"`action` must be one of {', '.join(SPLIT_ACTIONS)}", "action")
        unknown = sorted(set(data) - _SPLIT_KEYS.get(str(action), {"action"}))
        if unknown:
            raise bad_request(f"`{action}` takes no key `{unknown[0]}`")
        try:
            await splits.act(str(action), data, actor)
        except ConfigError as exc:
            raise bad_request("; ".join(f"{p.key}: {p.message}" for p in exc.problems)) from None
        except RolloutError as exc:
            note_reason(send, "command_refused")
            raise HttpError(409, str(exc), code="rollout_refused") from None
        await send_json(send, 200, {"split": splits.status()})

    async def _json_body(
        self, receive: Receive, headers: dict[str, str], what: str = "a JSON object"
    ) -> dict[str, Any]:
        """The request's JSON object; HttpError 415, 413 or 400 (saying it must be ``what``)."""
        media = unsupported_media(headers)
        if media is not None:
            raise media
        body = await read_body(receive, headers, MAX_COMMAND_BYTES)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise bad_request(f"the body must be {what}")
        return data

    async def _apply_here(self, command: Command, actor: str) -> Applied:
        return Applied(self.control.apply(command, actor=actor))

    async def _events(self, receive: Receive, send: Send, query: dict[str, str]) -> None:
        since = _int(query, "since", 0)
        run = self.control.run
        if query.get("run", run) != run:
            since = 0  # counted in a run before this router restarted: all of this run is new
        backlog = [e for e in self.control.audit if e.seq > since]
        if not _flag(query, "follow"):
            await send_json(send, 200, {"run": run, "events": [e.to_dict() for e in backlog]})
            return
        jsonl = query.get("format") == "jsonl"
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._followers.add(queue)
        unsubscribe = self.control.subscribe(queue.put_nowait)
        watcher = asyncio.create_task(_wait_disconnect(receive, queue))
        content_type = b"application/x-ndjson" if jsonl else b"text/event-stream"
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", content_type),
                        (b"cache-control", b"no-cache"),
                        (RUN_HEADER, run.encode()),
                    ],
                }
            )
            for old in backlog:
                await send(_event_chunk(old, jsonl))
            while (new := await queue.get()) is not None:
                await send(_event_chunk(new, jsonl))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            unsubscribe()
            self._followers.discard(queue)
            watcher.cancel()


_SPLIT_KEYS = {
    "canary": {"action", "version", "replicas", "model", "manual", "settings"},
    "step": {"action", "percent"},
}
"""The keys each split action takes beside ``action`` (the others take none)."""


def token_refusal(token: bytes | None, headers: dict[str, str]) -> HttpError | None:
    """The 401 or 403 a request earns when ``token`` is set and the request does not carry
    it as ``Authorization: Bearer <token>``; None when it may pass."""
    if token is None:
        return None
    given = headers.get("authorization")
    if given is None:
        return HttpError(
            401, "a bearer token is required", "authentication_error", code="unauthorized"
        )
    # RFC 9110: the scheme is case-insensitive (``bearer x`` is ``Bearer x``).
    scheme, _, credentials = given.strip().partition(" ")
    right = hmac.compare_digest(credentials.strip().encode("latin-1"), token)
    if scheme.lower() != "bearer" or not right:
        return HttpError(403, "the bearer token is wrong", "permission_error", code="forbidden")
    return None


def _rollout_start(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The version and settings of a ``start``; HttpError 400 when they cannot be read."""
    unknown = sorted(set(data) - {"action", "version", "settings"})
    if unknown:
        raise bad_request(f"unexpected key `{unknown[0]}`; a start takes `version`, `settings`")
    version, settings = data.get("version"), data.get("settings", {})
    if not isinstance(version, str) or not VERSION_NAME.match(version):
        raise bad_request("`version` must be a model name such as org/model-v2", "version")
    if not isinstance(settings, dict):
        raise bad_request("`settings` must be a JSON object", "settings")
    return version, settings


def admin_token(fleet: FleetConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """The token in the environment variable ``server.admin_token_env`` names; None when it
    names none. ConfigError when the variable is not set (or empty): an operator who named
    one meant the admin API to need a token, and serving it open would hide the mistake."""
    name = fleet.server.admin_token_env
    if name is None:
        return None
    token = environ.get(name)
    if not token:
        message = (
            f"names the environment variable {name}, which is not set (or is empty); set it "
            "to the admin API's token, or remove server.admin_token_env"
        )
        source = str(fleet.source or "fleet")
        raise ConfigError([Problem(source, None, "server.admin_token_env", message)])
    return token


async def _wait_disconnect(receive: Receive, queue: asyncio.Queue[Event | None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(None)


def _event_chunk(event: Event, jsonl: bool) -> dict[str, Any]:
    data = orjson.dumps(event.to_dict())
    body = data + b"\n" if jsonl else b"id: %d\ndata: %s\n\n" % (event.seq, data)
    return {"type": "http.response.body", "body": body, "more_body": True}


def fleet_shape(fleet: FleetConfig) -> dict[str, Any]:
    """``GET /admin/fleet``'s answer: the fleet's nodes, GPUs and replicas as the fleet file
    gives them, and its console settings; nothing of the broker or the listeners."""
    console = fleet.console
    return {
        "cluster": fleet.cluster,
        "model": fleet.model,
        "nodes": [dataclasses.asdict(node) for node in fleet.nodes],
        "console": {
            "theme": console.theme,
            "refresh_s": console.refresh_s,
            "keys": dict(console.keys),
        },
    }


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name) in ("1", "true", "yes")


def _int(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise bad_request(f"`{name}` must be an integer", name) from None
