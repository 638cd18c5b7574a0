"""Outlier ejection can never eject the fleet: ejected replicas are probed during their
window, at most ``max_ejection_percent`` of the replicas in service are out at once, and
panic mode routes to every replica when too few are healthy, saying so loudly.

The health monitor runs on a manual clock against a fake fleet: each replica answers its
health check and generates (the readmission probe) as the test's schedule says, and the
requests the router sends succeed or fail the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.clock import ManualClock
from router.config.schema import HealthConfig
from router.control import ControlSurface, Drain
from router.core import RouterCore
from router.http.ejection_limits import FleetHealth
from router.http.health import HealthMonitor
from router.http.metrics import RouterMetrics
from router.http.server import RouterServer
from router.replica import ReplicaState
from tests.http_support import MODEL, openai_client, routed
from tests.test_emulator_support import Spec, fleet_config, until
from tests.test_http_failover import FAST_RETRY

IDS = [f"r{i}" for i in range(8)]
CHECK_S = 5.0
STEP_S = 0.5
HEALTH = HealthConfig(
    check_interval_s=CHECK_S,
    eject_after_failures=5,
    eject_base_s=10.0,
    eject_max_s=300.0,
    stream_idle_max_s=0.0,
)


@dataclass
class Down:
    """When a replica's health check fails and when it cannot generate (half-open)."""

    health: tuple[float, float]
    generation: tuple[float, float]


@dataclass
class FakeFleet:
    """Replicas that answer as their schedule says, at the monitor's clock."""

    clock: ManualClock
    endpoints: dict[str, str]
    down: dict[str, list[Down]] = field(default_factory=dict)

    def kill(self, replica: str, at: float, health_back: float, generates_back: float) -> None:
        self.down.setdefault(replica, []).append(Down((at, health_back), (at, generates_back)))

    def answers_health(self, replica: str) -> bool:
        now = self.clock()
        return not any(d.health[0] <= now < d.health[1] for d in self.down.get(replica, []))

    def generates(self, replica: str) -> bool:
        now = self.clock()
        return not any(d.generation[0] <= now < d.generation[1] for d in self.down.get(replica, []))

    def _replica(self, url: str) -> str:
        return next(r for r, base in self.endpoints.items() if url.startswith(base))

    async def probe(self, url: str, _timeout_s: float) -> str | None:
        return None if self.answers_health(self._replica(url)) else "connection refused"

    async def generate(self, url: str, _model: str, _timeout_s: float) -> str | None:
        ok = self.generates(self._replica(url))
        return None if ok else "generation probe failed: answered 503"


@dataclass
class Rig:
    clock: ManualClock
    core: RouterCore
    control: ControlSurface
    health: HealthMonitor
    fleet: FakeFleet
    metrics: RouterMetrics


def rig(config: HealthConfig = HEALTH, ids: list[str] = IDS) -> Rig:
    clock = ManualClock()
    core = RouterCore(fleet_config(*(Spec(i) for i in ids)), clock=clock)
    control = ControlSurface(core, wall_clock=lambda: 1_700_000_000.0)
    fleet = FakeFleet(clock, {r.id: r.config.endpoint for r in core.pool})
    health = HealthMonitor(core, config, fleet.probe, generate=fleet.generate)
    return Rig(clock, core, control, health, fleet, RouterMetrics(core))


def ejected(r: Rig) -> list[str]:
    return [x.id for x in r.core.pool if x.state is ReplicaState.EJECTED]


async def step(r: Rig) -> None:
    """Half a second: one request to every replica in service (failed where it cannot
    generate, as the proxy reports it), then the monitor's round."""
    r.clock.advance(STEP_S)
    for replica in r.core.pool:
        if replica.state is ReplicaState.ACTIVE:
            if r.fleet.generates(replica.id):
                r.health.success(replica)
            else:
                r.health.failure(replica, f"{replica.id}: cannot connect")
    await r.health.round()


def gauge(r: Rig, name: str) -> str:
    lines = r.metrics.render().decode().splitlines()
    return next(line for line in lines if line.startswith(name + " "))


# ---- the limits' arithmetic -------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_service", "percent", "most"),
    [(1, 50, 0), (2, 50, 1), (3, 50, 1), (8, 50, 4), (3, 33.34, 1), (8, 100, 8), (8, 0, 0)],
)
def test_the_maximum_ejected_share_is_rounded_down(
    in_service: int, percent: float, most: int
) -> None:
    assert FleetHealth(in_service, in_service).max_ejected(percent) == most


@given(st.integers(1, 10_000), st.floats(0, 99.99))
def test_below_100_percent_one_replica_in_service_always_stays(
    in_service: int, percent: float
) -> None:
    assert FleetHealth(in_service, 0).max_ejected(percent) < in_service


def test_panic_is_fewer_healthy_than_the_threshold_and_never_with_nothing_in_service() -> None:
    assert FleetHealth(8, 3).panic(50)
    assert not FleetHealth(8, 4).panic(50)
    assert not FleetHealth(0, 0).panic(50)
    assert not FleetHealth(8, 0).panic(0)


# ---- the fleet under a replica kill every 5 s -------------------------------------------


async def test_killed_every_5_s_and_restarted_the_fleet_is_never_all_ejected() -> None:
    """The chaos run: a replica killed every 5 s, round the fleet, each back (health and
    generation) 5 s later, so all but one answer at any moment. Ejection windows grow with
    each ejection in a row (40 s by the third), yet every replica is readmitted by the first
    check after its restart, and the fleet is never all out."""
    r = rig()
    restarts: list[tuple[str, float]] = []
    for k in range(40):  # 200 s: each replica killed five times
        replica, at = IDS[k % len(IDS)], 5.0 * k + 1.0
        r.fleet.kill(replica, at, at + 5.0, at + 5.0)
        restarts.append((replica, at + 5.0))
    most_out = longest_row = 0
    while r.clock() < 205.0:
        await step(r)
        out = ejected(r)
        most_out = max(most_out, len(out))
        rows = (e.in_row for e in r.health.ejections.values())
        longest_row = max(longest_row, *rows, 0)
        answering = [i for i in IDS if r.fleet.answers_health(i)]
        assert len(out) < len(IDS), f"all ejected at {r.clock()} s while {answering} answer"
        for replica, back in restarts:
            # Probed at every check during its window: back within a check of its restart.
            if back + CHECK_S + STEP_S <= r.clock() < back + CHECK_S + 2 * STEP_S:
                state = r.core.replica(replica).state
                assert state is ReplicaState.ACTIVE, f"{replica} out at {r.clock()} s"
    assert most_out >= 1  # the kills were seen
    assert longest_row >= 3  # its window had grown to 40 s, yet it came back in seconds
    assert r.core.panic is None


async def test_replicas_killed_one_after_another_engage_panic_and_it_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Replicas killed one after another, each restarting for 30 s: its health endpoint is
    back 5 s after the kill (all but one answer /health) but it generates nothing until its
    engine is up. Never more than half the fleet is ejected; when five of eight are judged
    unhealthy, panic mode routes to every replica, and the log, the audit trail, the core's
    state, the snapshot and /metrics say so; it ends when enough are back."""
    caplog.set_level(logging.INFO, logger="router.http.health")
    r = rig()
    for k, replica in enumerate(IDS[:6]):
        at = 5.0 * k + 1.0
        r.fleet.kill(replica, at, at + 5.0, at + 30.0)
    assert gauge(r, "gpurouter_panic") == "gpurouter_panic 0.0"
    panicked_at = None
    seen_gauge = ""
    while r.clock() < 90.0:
        await step(r)
        out = ejected(r)
        assert len(out) <= 4, f"{out} ejected at {r.clock()} s"
        assert len(out) < len(IDS)
        if r.core.panic is not None and panicked_at is None:
            panicked_at = r.clock()
            seen_gauge = gauge(r, "gpurouter_panic")
            assert out == []  # every replica in service is routed to
            assert r.core.snapshot().panic == r.core.panic
            assert "5 of 8 replicas in service healthy" not in r.core.panic
            assert "3 of 8 replicas in service healthy (panic below 50%)" in r.core.panic
    assert panicked_at is not None
    assert seen_gauge == "gpurouter_panic 1.0"
    # All generate again from 56 s: panic is over and every replica is back in service.
    assert r.core.panic is None
    assert gauge(r, "gpurouter_panic") == "gpurouter_panic 0.0"
    assert ejected(r) == []
    panics = [e for e in r.control.audit if e.kind == "panic"]
    assert [e.args["engaged"] for e in panics] == [True, False]
    assert panics[0].message.startswith("PANIC: 3 of 8 replicas in service healthy")
    assert panics[0].message.endswith("routing to every replica in service")
    assert panics[1].message.startswith("panic over: ")
    # The panic's readmissions follow it in the trail and say why.
    after = list(r.control.audit)[list(r.control.audit).index(panics[0]) + 1 :]
    readmitted = [e for e in after[:4] if e.kind == "state"]
    assert len(readmitted) == 4
    assert all(e.message.endswith(f"(panic mode: {panics[0].args['reason']})") for e in readmitted)
    logged = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any(m.startswith("PANIC: 3 of 8 replicas in service healthy") for m in logged)
    assert any(m.startswith("panic over: ") for m in logged)


async def test_an_automatic_ejection_says_why_in_the_trail() -> None:
    r = rig(ids=IDS[:2])
    r.fleet.kill("r0", 0.0, 100.0, 100.0)
    await step(r)
    for _ in range(4):
        await step(r)
    (event,) = [e for e in r.control.audit if e.kind == "state"]
    assert event.message == (
        "r0: active -> ejected (5 failed requests in a row: r0: cannot connect)"
    )
    assert event.args["reason"] == "5 failed requests in a row: r0: cannot connect"
    assert r.core.replica("r0").state_reason == event.args["reason"]
    status = r.health.status()["r0"]
    assert isinstance(status, dict)
    assert status["ejection"]["cause"] == "failures"
    assert status["ejection"]["next_probe_s"] <= CHECK_S


async def test_a_replica_beyond_the_maximum_stays_in_service_counted_unhealthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two of three dead with panic mode off: one is ejected (50% of 3, rounded down), the
    other stays in service, judged unhealthy, and the log says why."""
    caplog.set_level(logging.WARNING, logger="router.http.health")
    config = HealthConfig(
        check_interval_s=CHECK_S, eject_after_failures=5, stream_idle_max_s=0.0,
        panic_threshold_percent=0,
    )  # fmt: skip
    r = rig(config, IDS[:3])
    r.fleet.kill("r0", 0.0, 100.0, 100.0)
    r.fleet.kill("r1", 0.0, 100.0, 100.0)
    for _ in range(6):
        await step(r)
    assert ejected(r) == ["r0"]
    assert r.core.replica("r1").state is ReplicaState.ACTIVE
    status = r.health.status()["r1"]
    assert isinstance(status, dict)
    assert status["unhealthy"]["cause"] == "failures"
    assert "at most 1 may be (max_ejection_percent 50)" in status["unhealthy"]["kept_in_service"]
    assert any("r1 is unhealthy" in rec.getMessage() for rec in caplog.records)
    assert r.core.panic is None
    # r0 recovers and is readmitted: r1 takes its place out of rotation.
    r.fleet.down["r0"].clear()
    r.clock.advance(CHECK_S)
    await step(r)
    assert ejected(r) == ["r1"]


async def test_an_operator_drain_that_leaves_too_few_healthy_sets_off_panic_after_it() -> None:
    """The trail is causal: the drain and its state change, then the panic it set off and
    the readmissions panic made."""
    r = rig(ids=IDS[:4])
    r.fleet.kill("r0", 0.0, 100.0, 100.0)
    r.fleet.kill("r1", 0.0, 100.0, 100.0)
    for _ in range(5):
        await step(r)
    assert ejected(r) == ["r0", "r1"]  # two of four: the most allowed, half still healthy
    assert r.core.panic is None
    before = len(r.control.audit)
    r.control.apply(Drain("r2"), actor="alice")
    messages = [e.message for e in list(r.control.audit)[before:]]
    assert messages[:2] == ["r2: draining, 0 in flight", "r2: active -> draining (by alice)"]
    assert messages[2] == (
        "PANIC: 1 of 3 replicas in service healthy (panic below 50%): "
        "routing to every replica in service"
    )
    reason = "panic mode: 1 of 3 replicas in service healthy (panic below 50%)"
    assert messages[3:] == [
        f"r0: ejected -> active ({reason})",
        f"r1: ejected -> active ({reason})",
        "r2: draining -> drained (nothing left in flight)",
    ]
    assert ejected(r) == []


async def test_replicas_kept_in_by_panic_are_healthy_again_once_they_generate() -> None:
    r = rig(ids=IDS[:2])
    for replica in IDS[:2]:
        r.fleet.kill(replica, 0.0, 0.0, 3.0)  # /health answers throughout
    for _ in range(5):
        await step(r)
    assert r.core.panic is not None  # both unhealthy: both stay in, routed to
    assert ejected(r) == []
    while r.clock() < 11.0:
        await step(r)  # they generate again: requests and readmission probes say so
    assert r.core.panic is None
    assert r.health.unhealthy == {}
    assert ejected(r) == []


# ---- live: the router on loopback in front of emulated replicas -------------------------


LIVE = HealthConfig(
    check_interval_s=0.05,
    check_timeout_s=0.5,
    eject_after_failures=2,
    eject_base_s=60.0,
    eject_max_s=600.0,
    stream_idle_max_s=0.0,
    engine_metrics_interval_s=0,
    models_interval_s=0,
)
"""A 60 s ejection window: only a probe during the window can bring a replica back in time."""


async def _until_ejected(server: RouterServer, replica: str) -> None:
    client = openai_client(server)
    try:
        while server.core.replica(replica).state is ReplicaState.ACTIVE:
            await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
    finally:
        await client.close()


async def test_live_a_revived_replica_is_back_within_a_check_not_its_window() -> None:
    async with routed((Spec("a"), Spec("b")), retries=FAST_RETRY, health=LIVE) as (server, emu):
        a = server.core.replica("a")
        await emu.kill("a")
        await _until_ejected(server, "a")
        ejection = server.health.ejections[a.index]
        assert ejection.until - server.core.clock() > 50  # its window has barely begun
        await until(lambda: ejection.probe is not None, timeout=5)  # probed while out
        await emu.revive("a")
        await until(lambda: a.state is ReplicaState.ACTIVE, timeout=5)
        assert a.state_reason == "a generation probe answered"


async def test_live_panic_is_in_the_admin_state_and_metrics() -> None:
    """Both replicas dead: one is ejected (half of two), the second failing one sets off
    panic mode, which readmits the first; /admin/state and /metrics say so, and requests
    are answered (502, every attempt failed) rather than held for a replica."""
    async with routed((Spec("a"), Spec("b")), retries=FAST_RETRY, health=LIVE) as (server, emu):
        await emu.kill("a")
        await emu.kill("b")
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": MODEL, "prompt": "p", "max_tokens": 2}
            while server.core.panic is None:
                response = await client.post(server.front_url + "/v1/completions", json=body)
                assert response.status_code == 502
            assert [r.state for r in server.core.pool] == [ReplicaState.ACTIVE] * 2
            state = (await client.get(server.admin_url + "/admin/state")).json()
            metrics = (await client.get(server.front_url + "/metrics")).text
        assert state["panic"].startswith("0 of 2 replicas in service healthy")
        assert state["health"]["a"]["unhealthy"]["kept_in_service"] == "panic mode"
        assert "gpurouter_panic 1.0" in metrics.splitlines()
        await emu.revive("a")
        await emu.revive("b")
        await until(lambda: server.core.panic is None, timeout=5)
