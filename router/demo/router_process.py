"""The demo's router (:mod:`router.demo.router_child`) seen from the console's process.

:class:`RouterProcess` starts the child (its start, stop and the report of a child that dies
are :class:`~router.demo.child_process.ChildProcess`'s) and knows where it listens and its
admin token. The console steers it as any attached console does, through the admin API; the
demo itself asks that API only for the router's endings, for the summary
(:meth:`RouterProcess.outcomes`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import aiohttp

from router.demo.channel import RouterPlan, RouterReady
from router.demo.child_process import ChildProcess

__all__ = ["RouterProcess", "new_token"]

_ASK_TIMEOUT_S = 5.0
"""The router answers its state in milliseconds; this bounds a router that is going away."""


def new_token() -> str:
    """A bearer token for the demo's admin API, made afresh for each run."""
    return secrets.token_urlsafe(24)


class RouterProcess(ChildProcess[RouterReady]):
    """The router in a child process, once started: :attr:`ready` says where it listens."""

    module = "router.demo.router_child"
    holds = "front door, admin API, telemetry subscriber"
    name = "router"
    ready_type = RouterReady

    def __init__(self, plan: RouterPlan, on_lost: Callable[[str], None] | None = None) -> None:
        super().__init__(plan, on_lost)
        self.plan: RouterPlan = plan

    @property
    def token(self) -> str:
        return self.plan.admin_token

    async def outcomes(self, admin_url: str) -> dict[str, int] | None:
        """The router's endings so far (``GET /admin/state``); None when it does not answer."""
        if not self.running:
            return None
        timeout = aiohttp.ClientTimeout(total=_ASK_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self.token}", "X-Actor": "demo"}
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout, headers=headers) as session,
                session.get(f"{admin_url}/admin/state") as response,
            ):
                if response.status != 200:
                    return None
                state = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        outcomes = state.get("outcomes") if isinstance(state, dict) else None
        if not isinstance(outcomes, dict):
            return None
        return {str(k): int(v) for k, v in outcomes.items() if isinstance(v, int)}
