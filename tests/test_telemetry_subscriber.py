"""The subscriber's handler: validation, counting, ageing, mapping GPUs to replicas."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.clock import ManualClock
from router.core import RouterCore
from router.request import Request
from router.telemetry.schema import GpuBatch, GpuInventory, GpuSample, NodeStatus, encode
from router.telemetry.subscriber import TelemetrySubscriber
from router.telemetry.topics import Topics
from tests.telemetry_helpers import PERIOD_S, feed, fleet, target

TOPICS = Topics("h100-a100-l4")


def make() -> tuple[TelemetrySubscriber, RouterCore, ManualClock]:
    clock = ManualClock(100.0)
    config = fleet()
    core = RouterCore(config, clock=clock)
    return TelemetrySubscriber(config, core, broker=target("mqtt://127.0.0.1:1")), core, clock


def batch(
    seq: int, session: int = 7, node: str = "h100-node", utils: tuple[float, ...] = (50, 30)
) -> bytes:
    gpus = tuple(
        GpuSample(i, gpu_util_pct=u, fb_used_mib=40_000, fb_total_mib=80_000, replica="wrong")
        for i, u in enumerate(utils)
    )
    return encode(GpuBatch(node, session, seq, 1.7e9, PERIOD_S, gpus))


def status(state: str, session: int = 7, node: str = "h100-node") -> bytes:
    gpus = (GpuInventory(0, name="NVIDIA H100 80GB HBM3"), GpuInventory(1))
    return encode(NodeStatus(node, state, session, "0.1.0", PERIOD_S, gpus, 1.7e9))  # type: ignore[arg-type]


def test_gpus_map_to_replicas_by_the_fleet_file_not_by_the_payload() -> None:
    """GPU 0 feeds h100-0 and GPU 1 h100-1, whatever replica the payload names."""
    sub, core, clock = make()
    sub.handle(TOPICS.gpus("h100-node"), batch(0, utils=(50, 30)))
    t0, t1 = core.replica("h100-0").telemetry, core.replica("h100-1").telemetry
    assert t0 is not None
    assert t0.utilization == 0.5
    assert t0.received_at == clock.now
    assert t1 is not None
    assert t1.utilization == 0.3
    assert t1.memory_used_fraction == 0.5


def test_sequence_gaps_count_as_lost_and_a_new_session_as_a_restart() -> None:
    sub, _, _ = make()
    for seq in (0, 1, 4, 5):
        sub.handle(TOPICS.gpus("h100-node"), batch(seq))
    sub.handle(TOPICS.gpus("h100-node"), batch(0, session=8))
    node = feed(sub, "h100-node")
    assert (node.samples, node.lost_samples, node.restarts, node.session) == (5, 2, 1, 8)


def test_a_repeated_or_older_sample_is_dropped_not_applied() -> None:
    sub, core, clock = make()
    sub.handle(TOPICS.gpus("h100-node"), batch(3, session=8))
    clock.advance(0.1)
    sub.handle(TOPICS.gpus("h100-node"), batch(3, session=8))
    sub.handle(TOPICS.gpus("h100-node"), batch(9, session=7))
    node = feed(sub, "h100-node")
    assert (node.samples, node.dropped) == (1, 2)
    telemetry = core.replica("h100-0").telemetry
    assert telemetry is not None
    assert telemetry.received_at == 100.0


def test_age_comes_from_the_router_clock_and_three_periods_make_stale() -> None:
    """The payload's ts says nothing of age; arrival on the router's clock does."""
    sub, core, clock = make()
    sub.handle(TOPICS.gpus("h100-node"), batch(0))
    clock.advance(3 * PERIOD_S)
    assert not feed(sub, "h100-node").stale
    assert core.replica("h100-0").utilization(clock.now, 3 * PERIOD_S) == (0.5, True)
    clock.advance(0.01)
    node = feed(sub, "h100-node")
    assert node.stale
    assert node.age_s is not None
    assert node.age_s > 3 * PERIOD_S
    assert core.replica("h100-0").utilization(clock.now, 3 * PERIOD_S) == (0.0, False)


def test_a_decision_on_stale_telemetry_says_router_accounting_was_used() -> None:
    sub, core, clock = make()
    sub.handle(TOPICS.gpus("h100-node"), batch(0))
    assert core.submit(Request("fresh", 10, 10, clock.now)) is None
    assert core.decisions[-1].telemetry_note == ""
    clock.advance(1.0)
    assert core.submit(Request("stale", 10, 10, clock.now)) is None
    explained = core.decisions[-1]
    assert explained.telemetry_note.startswith("stale GPU telemetry on h100-0, h100-1")
    assert "router accounting" in explained.telemetry_note
    fresh = {c.replica: c.telemetry_fresh for c in explained.candidates}
    assert fresh["h100-0"] is False
    assert fresh["a100-0"] is None


def test_a_lost_gpu_leaves_its_replica_to_go_stale() -> None:
    """Half a reading is not a reading: the replica keeps its old telemetry, which ages."""
    sub, core, clock = make()
    sub.handle(TOPICS.gpus("h100-node"), batch(0))
    clock.advance(0.1)
    lost = GpuBatch(
        "h100-node",
        7,
        1,
        1.7e9,
        PERIOD_S,
        (GpuSample(0, lost=True, error="GPU is lost"), GpuSample(1, gpu_util_pct=10)),
    )
    sub.handle(TOPICS.gpus("h100-node"), encode(lost))
    t0, t1 = core.replica("h100-0").telemetry, core.replica("h100-1").telemetry
    assert t0 is not None
    assert t0.received_at == 100.0
    assert t1 is not None
    assert t1.received_at == clock.now
    assert t1.utilization == 0.1
    assert feed(sub, "h100-node").gpus[0].lost


def test_status_marks_online_and_offline_and_an_old_will_is_ignored() -> None:
    sub, core, _ = make()
    sub.handle(TOPICS.status("h100-node"), status("online", session=7))
    assert feed(sub, "h100-node").online
    assert core.replica("h100-0").node_online
    sub.handle(TOPICS.status("h100-node"), status("online", session=9))
    sub.handle(TOPICS.status("h100-node"), status("offline", session=7))  # a late old will
    node = feed(sub, "h100-node")
    assert node.online
    assert node.session == 9
    assert node.restarts == 1
    sub.handle(TOPICS.status("h100-node"), status("offline", session=9))
    assert not feed(sub, "h100-node").online
    assert core.replica("h100-1").node_online is False


def test_samples_of_a_session_newer_than_the_status_mean_online() -> None:
    """A retained offline from an older session does not hide a node that is sending."""
    sub, _, _ = make()
    sub.handle(TOPICS.status("h100-node"), status("offline", session=7))
    sub.handle(TOPICS.gpus("h100-node"), batch(0, session=8))
    assert feed(sub, "h100-node").online


def test_topics_not_asked_for_are_ignored_and_unknown_nodes_counted() -> None:
    sub, core, _ = make()
    for topic in (
        "gpurouter/v1/other-cluster/nodes/h100-node/gpus",
        TOPICS.router_stats("r1"),
        TOPICS.desired("strategy"),
        TOPICS.gpus("h100-node") + "/extra",
        "$SYS/broker/uptime",
    ):
        sub.handle(topic, batch(0))
    sub.handle(TOPICS.gpus("ghost-node"), batch(0, node="ghost-node"))
    status_now = sub.status()
    assert (status_now.ignored, status_now.dropped_unknown, status_now.dropped) == (5, 1, 1)
    assert all(r.telemetry is None for r in core.pool)


def test_oversized_wrong_version_and_mislabelled_payloads_are_dropped_with_a_reason() -> None:
    sub, _, _ = make()
    topic = TOPICS.gpus("h100-node")
    sub.handle(topic, b" " * (sub.max_payload_bytes + 1))
    assert "over" in (feed(sub, "h100-node").last_error or "")
    sub.handle(topic, batch(0).replace(b'"v":1', b'"v":2'))
    assert "v: expected 1" in (feed(sub, "h100-node").last_error or "")
    sub.handle(topic, batch(0, node="l4-node"))
    assert "names node 'l4-node'" in (feed(sub, "h100-node").last_error or "")
    sub.handle(topic, "text, not bytes")
    node = feed(sub, "h100-node")
    assert (node.dropped, node.samples) == (4, 0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=30,
)
gpu_keys = st.sampled_from(
    ["index", "gpu_util_pct", "fb_used_mib", "fb_total_mib", "lost", "replica", "mig", "name"]
)
near_valid = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 2, "1", None]),
        "node": st.sampled_from(["h100-node", "l4-node", "", 3]),
        "session": st.integers(-2, 10),
        "seq": st.integers(-2, 50),
        "ts": st.floats(allow_nan=True) | st.integers(),
        "period_s": st.sampled_from([0.1, 0, -1, 1e9, "x"]),
        "gpus": st.lists(st.dictionaries(gpu_keys, json_values, max_size=6), max_size=4),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(
        st.binary(max_size=200) | near_valid.map(lambda d: json.dumps(d).encode()), max_size=8
    )
)
def test_fuzzed_gpu_payloads_never_raise_and_each_is_applied_or_counted(
    payloads: list[bytes],
) -> None:
    sub, _, _ = make()
    for payload in payloads:
        sub.handle(TOPICS.gpus("h100-node"), payload)
    node = feed(sub, "h100-node")
    assert node.samples + node.dropped == len(payloads)


@settings(max_examples=200, deadline=None)
@given(payload=json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=100))
def test_fuzzed_status_payloads_never_raise(payload: bytes) -> None:
    sub, _, _ = make()
    sub.handle(TOPICS.status("h100-node"), payload)
    node = feed(sub, "h100-node")
    assert node.dropped == 1 or node.session is not None
