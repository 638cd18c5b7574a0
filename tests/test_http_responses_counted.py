"""Every answer is counted on /metrics: the front door's and the admin API's, refusals that
never reach the core included, by route, status and reason; and the MQTT feeds' drops
(telemetry payloads, control messages) are there too, not only in the admin state."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.config.schema import QueueConfig, ServerConfig
from router.control import Eject
from router.emulator import EmulatedFleet
from router.http.asgi import Receive, Scope, Send
from router.http.server import RouterServer
from router.telemetry.control_topics import ControlLink
from router.telemetry.status import TelemetryStatus
from router.telemetry.subscriber import TelemetrySubscriber
from router.telemetry.topics import Topics
from tests.http_support import MODEL, Spec, hint, routed, routed_fleet
from tests.telemetry_helpers import target
from tests.test_emulator_support import any_ports, fleet_config, until

ONE = (Spec("a"),)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RESPONSES = "gpurouter_http_responses_total"
Labels = tuple[tuple[str, str], ...]


def samples(text: str) -> dict[tuple[str, Labels], float]:
    """Every sample of a /metrics body, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def responses(text: str) -> dict[tuple[str, str, str], float]:
    """``gpurouter_http_responses_total`` by (route, status, reason)."""
    found = {}
    for (name, labels), value in samples(text).items():
        if name == RESPONSES:
            d = dict(labels)
            found[d["route"], d["status"], d["reason"]] = value
    return found


async def scrape(server: RouterServer) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(server.front_url + "/metrics")
    assert response.status_code == 200
    return response.text


async def test_refusals_that_never_reach_the_core_are_counted_by_route_status_and_reason() -> None:
    async with routed(ONE, server=ServerConfig(max_body_bytes=2048)) as (server, _):

        async def broken(_scope: Scope, _receive: Receive, _send: Send) -> None:
            raise RuntimeError("a bug in a handler")

        server.front.routes["/v1/models"] = ("GET", broken)  # the one route a bug can reach
        url = server.front_url
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            assert (await client.post("/v1/chat/completions", content=b"{")).status_code == 400
            bad_id = {"X-Request-ID": "x" * 200}
            sent = await client.post("/v1/chat/completions", json=CHAT, headers=bad_id)
            assert sent.status_code == 400
            unknown = {**CHAT, "model": "gpt-9"}
            assert (await client.post("/v1/chat/completions", json=unknown)).status_code == 404
            assert (await client.get("/no/such/path")).status_code == 404
            assert (await client.get("/another/made/up/path")).status_code == 404
            assert (await client.get("/v1/completions")).status_code == 405
            big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
            assert (await client.post("/v1/chat/completions", json=big)).status_code == 413
            assert (await client.get("/v1/models")).status_code == 500
            server.control.apply(Eject("a"))
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 503
            assert (await client.get("/ready")).status_code == 503
        counted = responses(await scrape(server))
    assert counted == {
        ("/v1/chat/completions", "200", "ok"): 1,
        ("/v1/chat/completions", "400", "invalid_request"): 1,
        ("/v1/chat/completions", "400", "invalid_request_id"): 1,
        ("/v1/chat/completions", "404", "model_not_found"): 1,
        ("other", "404", "not_found"): 2,  # made-up paths share one series
        ("/v1/completions", "405", "method_not_allowed"): 1,
        ("/v1/chat/completions", "413", "request_too_large"): 1,
        ("/v1/models", "500", "server_error"): 1,
        ("/v1/chat/completions", "503", "no_healthy_replica"): 1,
        ("/ready", "503", "not_ready"): 1,
    }
    assert sum(server.core.outcomes.values()) == 1  # the rest never reached the core


async def test_a_full_queue_429_and_a_relayed_replica_error_are_counted() -> None:
    queue = QueueConfig(size=1, default_deadline_s=30)
    async with routed(ONE, batch_size=1, queue=queue, time_scale=20) as (server, _):
        async with httpx.AsyncClient(base_url=server.front_url, timeout=10) as client:
            long = {**CHAT, "max_tokens": 4000, **hint(10, 4000)}
            held = [asyncio.create_task(client.post("/v1/chat/completions", json=long))]
            await until(lambda: len(server.core.running) == 1)
            held.append(asyncio.create_task(client.post("/v1/chat/completions", json=long)))
            await until(lambda: len(server.core.queue) == 1)
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 429
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            await until(lambda: not server.core.running and not len(server.core.queue))
            # The replica refuses n > 1 itself: its 400 is relayed as it wrote it.
            refused = await client.post("/v1/chat/completions", json={**CHAT, "n": 2})
            assert refused.status_code == 400
        counted = responses(await scrape(server))
    assert counted[("/v1/chat/completions", "429", "queue_full")] == 1
    assert counted[("/v1/chat/completions", "400", "upstream")] == 1
    # The two held requests' clients left before an answer: counted, with no status.
    assert counted[("/v1/chat/completions", "none", "client_gone")] == 2


async def test_the_admin_apis_answers_are_counted_on_the_front_doors_metrics() -> None:
    token = "s3cret-token"
    async with routed(ONE, admin_token=token) as (server, _):
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=server.admin_url) as admin:
            assert (await admin.get("/admin/state", headers=auth)).status_code == 200
            assert (await admin.get("/admin/state")).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await admin.get("/admin/state", headers=wrong)).status_code == 403
            rebound = {**auth, "Host": "evil.example"}
            assert (await admin.get("/admin/state", headers=rebound)).status_code == 403
            plain = {**auth, "Content-Type": "text/plain"}
            drain = b'{"command": "drain", "replica": "a"}'
            sent = await admin.post("/admin/commands", content=drain, headers=plain)
            assert sent.status_code == 415
            fly = await admin.post("/admin/commands", json={"command": "fly"}, headers=auth)
            assert fly.status_code == 400
            undrain = {"command": "undrain", "replica": "a"}
            refused = await admin.post("/admin/commands", json=undrain, headers=auth)
            assert refused.status_code == 409
            assert (await admin.get("/admin/nope", headers=auth)).status_code == 404
        counted = responses(await scrape(server))
    assert counted == {  # the scrape itself is counted once it is answered: not in it
        ("/admin/state", "200", "ok"): 1,
        ("/admin/state", "401", "unauthorized"): 1,
        ("/admin/state", "403", "forbidden"): 1,
        ("/admin/state", "403", "forbidden_host"): 1,
        ("/admin/commands", "415", "unsupported_media_type"): 1,
        ("/admin/commands", "400", "invalid_command"): 1,
        ("/admin/commands", "409", "command_refused"): 1,
        ("admin_other", "404", "not_found"): 1,
    }


@asynccontextmanager
async def served_with_feeds() -> AsyncIterator[
    tuple[RouterServer, TelemetrySubscriber, ControlLink]
]:
    """A router whose telemetry status carries a real subscriber's and control link's
    counters (neither connected: their handlers are fed directly)."""
    config = fleet_config(*ONE)
    async with EmulatedFleet(config, time_scale=100, ports=any_ports(ONE)) as emulated:
        feeds: dict[str, Any] = {}

        def status() -> TelemetryStatus:
            sub: TelemetrySubscriber = feeds["subscriber"]
            link: ControlLink = feeds["link"]
            return dataclasses.replace(sub.status(), control=link.status())

        server = RouterServer(
            routed_fleet(config, emulated),
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            telemetry=status,
        )
        url = "mqtt://127.0.0.1:1"
        feeds["subscriber"] = TelemetrySubscriber(server.fleet, server.core, broker=url)
        feeds["link"] = ControlLink(server.control, target=target(url), router_id="r1")
        await server.start()
        try:
            yield server, feeds["subscriber"], feeds["link"]
        finally:
            await server.stop(grace_s=0)


async def test_telemetry_and_control_drops_are_on_metrics_by_reason() -> None:
    async with served_with_feeds() as (server, subscriber, link):
        topics = Topics(server.fleet.cluster)
        node = server.fleet.nodes[0].name
        subscriber.handle(topics.gpus(node), b"not json")
        subscriber.handle(topics.gpus(node), b"{}")
        subscriber.handle(topics.gpus("ghost-node"), b"{}")
        link.handle(topics.desired("strategy"), b"{")
        link.handle(topics.desired("strategy"), b"x" * 20_000)
        found = samples(await scrape(server))
    assert found[("gpurouter_telemetry_dropped_total", (("reason", "malformed"),))] == 2
    assert found[("gpurouter_telemetry_dropped_total", (("reason", "unknown_node"),))] == 1
    assert found[("gpurouter_telemetry_overflowed_total", ())] == 0
    assert found[("gpurouter_telemetry_lost_samples_total", (("node", node),))] == 0
    assert found[("gpurouter_telemetry_connected", ())] == 0
    assert found[("gpurouter_control_dropped_total", (("reason", "malformed"),))] == 1
    assert found[("gpurouter_control_dropped_total", (("reason", "oversized"),))] == 1
    assert found[("gpurouter_control_dropped_total", (("reason", "unsigned"),))] == 0
    assert found[("gpurouter_control_stale_total", ())] == 0


async def test_a_router_without_a_feed_writes_no_feed_metrics() -> None:
    async with routed(ONE) as (server, _):
        text = await scrape(server)
    assert "gpurouter_telemetry_" not in text
    assert "gpurouter_control_" not in text
