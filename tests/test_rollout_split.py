"""The traffic split (router/rollout/split.py) and its one hook in the core: a share of a
model's requests to the new version, the rest to the old; a side with no replica in service
gives its requests to the other; a retry goes to the side it did not fail on."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from router.core import RouterCore
from router.replica import Replica, ReplicaState
from router.request import Request
from router.rollout.split import TrafficSplit
from tests.fleet_factory import make_fleet
from tests.recorder import Recorder

MODEL, OLD, NEW = "test-model", "test-model", "test-model-v2"


def _core(new: tuple[int, ...] = (0,), n: int = 4, attempts: int = 3) -> RouterCore:
    """``n`` replicas; those at ``new`` serve the new version under the stable name too."""
    core = RouterCore(make_fleet([1.0] * n, [64] * n, attempts=attempts), rng=random.Random(7))
    for r in core.pool:
        r.served_models = (NEW, MODEL) if r.index in new else (OLD,)
    return core


def _request(i: int, model: str = MODEL) -> Request:
    return Request(f"q{i}", 10, 10, arrival=0.0, model=model)


@settings(max_examples=40, deadline=None)
@given(share=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
def test_the_new_versions_share_of_requests_converges_to_the_split(share: float, seed: int) -> None:
    core = _core()
    split = TrafficSplit(MODEL, OLD, NEW, share)
    rng = random.Random(seed)
    n = 4000
    to_new = 0
    for i in range(n):
        request = _request(i)
        request.split_coin = rng.random()
        to_new += split.version_for(request, core.pool.replicas) == NEW
    # Five standard deviations of a binomial share: a seed that misses it is a broken split.
    assert abs(to_new / n - share) <= 5 * (share * (1 - share) / n) ** 0.5 + 1e-9


@settings(max_examples=80, deadline=None)
@given(
    states=st.lists(st.sampled_from(list(ReplicaState)), min_size=4, max_size=4),
    share=st.floats(0.0, 1.0),
    coin=st.floats(0.0, 1.0, exclude_max=True),
)
def test_a_request_never_goes_to_a_version_with_no_replica_in_service(
    states: list[ReplicaState], share: float, coin: float
) -> None:
    core = _core(new=(0, 1))
    for r, state in zip(core.pool, states, strict=True):
        r.state = state
    split = TrafficSplit(MODEL, OLD, NEW, share)
    request = _request(0)
    request.split_coin = coin
    chosen = split.version_for(request, core.pool.replicas)
    live = split.in_service(core.pool.replicas)
    if live:
        assert chosen in live


def test_requests_for_another_name_or_for_the_exact_version_are_not_split() -> None:
    core = _core()
    split = TrafficSplit(MODEL, OLD, NEW, 1.0)
    for model in (NEW, "other-model"):
        request = _request(0, model)
        request.split_coin = 0.0
        assert split.version_for(request, core.pool.replicas) is None


def _placed(core: RouterCore, n: int) -> list[Replica]:
    recorder = Recorder()
    core.listeners.append(recorder)
    for i in range(n):
        assert core.submit(_request(i)) is None
    return [a.replica for a in recorder.assigned]


def test_at_0_percent_the_new_version_gets_none_and_at_100_it_gets_all() -> None:
    core = _core()
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 0.0))
    assert {r.version for r in _placed(core, 60)} == {OLD}
    core = _core()
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 1.0))
    assert {r.id for r in _placed(core, 60)} == {"r0"}


def test_without_a_split_both_versions_serve_the_stable_name() -> None:
    core = _core()
    assert {r.version for r in _placed(core, 60)} == {OLD, NEW}


def test_a_side_with_no_replica_in_service_gives_its_requests_to_the_other() -> None:
    core = _core()
    core.drain("r0")
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 1.0))
    assert {r.version for r in _placed(core, 20)} == {OLD}


def test_the_new_versions_overflow_goes_to_the_old_one() -> None:
    # A canary's few replicas past their slots would queue its share without end.
    core = _core()
    core.set_batch_size("r0", 4)
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 1.0))
    placed = _placed(core, 20)
    assert [r.id for r in placed[:4]] == ["r0"] * 4
    assert {r.version for r in placed[4:]} == {OLD}
    assert len(placed) == 20
    assert len(core.queue) == 0


def test_the_old_versions_overflow_never_goes_to_the_new_one() -> None:
    core = _core()
    for r in ("r1", "r2", "r3"):
        core.set_batch_size(r, 1)
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 0.0))
    placed = _placed(core, 10)
    assert sorted(r.id for r in placed) == ["r1", "r2", "r3"]
    assert len(core.queue) == 7  # they wait for the old version's slots


def test_with_both_versions_full_a_request_waits_for_the_side_it_drew() -> None:
    core = _core()
    for r in core.pool:
        core.set_batch_size(r.id, 1)
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 1.0))
    placed = _placed(core, 6)
    assert sorted(r.id for r in placed) == ["r0", "r1", "r2", "r3"]
    assert len(core.queue) == 2
    core.set_batch_size("r0", 3)  # the new version's slots: both waiting requests take them
    assert len(core.queue) == 0
    assert core.replica("r0").in_flight == 3


def test_a_retry_after_a_failure_on_the_new_version_goes_to_the_old_one() -> None:
    core = _core()
    recorder = Recorder()
    core.listeners.append(recorder)
    core.set_split(TrafficSplit(MODEL, OLD, NEW, 1.0))
    assert core.submit(_request(0)) is None
    first = recorder.assigned[-1]
    assert first.replica.id == "r0"
    core.fail(first, "r0 answered 500")
    retry = recorder.assigned[-1]
    assert retry is not first
    assert retry.replica.version == OLD
    core.complete(retry)
    assert recorder.outcome_of("q0") == "completed"
