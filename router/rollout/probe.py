"""Whether a replica serves a version: its ``/v1/models`` names it, and a one-token
generation of it succeeds (a model list alone is answered by an engine that cannot
generate: router/http/health.py's frozen engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import aiohttp

from router.http.served_models import (
    MAX_MODELS_BYTES,
    MODELS_PATH,
    ModelListError,
    parse_model_list,
)
from router.http.upstream import failure_reason

__all__ = ["HttpServingProbe", "Serving", "ServingProbe"]


@dataclass(frozen=True, slots=True)
class Serving:
    """What a replica answered: the models it lists (None: it did not say), and why it does
    not serve the version asked (None: it does)."""

    models: tuple[str, ...] | None
    problem: str | None


class ServingProbe(Protocol):
    async def check(self, base_url: str, version: str) -> Serving: ...


class HttpServingProbe:
    """Asks over HTTP, each request within ``timeout_s``."""

    def __init__(self, session: aiohttp.ClientSession, timeout_s: float = 10.0) -> None:
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def check(self, base_url: str, version: str) -> Serving:
        base = base_url.rstrip("/")
        try:
            async with self.session.get(base + MODELS_PATH, timeout=self.timeout) as answer:
                if answer.status != 200:
                    return Serving(None, f"{MODELS_PATH} answered {answer.status}")
                models = parse_model_list(await answer.content.read(MAX_MODELS_BYTES))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Serving(None, f"{MODELS_PATH}: {failure_reason(exc)}")
        except ModelListError as exc:
            return Serving(None, f"{MODELS_PATH}: {exc}")
        if version not in models:
            return Serving(models, f"serves {', '.join(models) or 'nothing'}, not {version}")
        problem = await self._generate(base, version)
        return Serving(models, problem)

    async def _generate(self, base: str, version: str) -> str | None:
        body = {"model": version, "prompt": "ping", "max_tokens": 1}
        try:
            async with self.session.post(
                base + "/v1/completions", json=body, timeout=self.timeout
            ) as answer:
                await answer.read()
                if answer.status != 200:
                    return f"a generation of {version} answered {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"a generation of {version} failed: {failure_reason(exc)}"
        return None
