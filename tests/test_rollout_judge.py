"""The canary's judge (router/rollout/judge.py): the new version is worse when its error rate
exceeds the old one's by more than the margin, or its p99 TTFT by more than the ratio, over
the window, once both versions have the minimum number of requests."""

from __future__ import annotations

from dataclasses import replace

from router.config.schema import CanaryConfig
from router.replica import Replica, Telemetry
from router.rollout.canary import card
from router.rollout.judge import Judge, Verdict
from tests.fleet_factory import make_fleet

RULES = CanaryConfig(
    window_s=10.0, min_requests=20, max_error_rate_increase=0.05, max_ttft_ratio=2.0
)


def _feed(judge: Judge, new: bool, n: int, errors: int, ttft: float, t: float = 0.0) -> None:
    for i in range(n):
        judge.observe(new, t, i >= errors, ttft)


def test_a_failing_new_version_is_judged_worse_with_both_figures() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 20, 20, 0.1)
    _feed(judge, False, 200, 0, 0.1)
    verdict = judge.verdict(1.0)
    assert verdict is not None
    assert verdict.new.error_rate == 1.0
    assert verdict.old.error_rate == 0.0
    text = verdict.text("v2", "v1")
    assert "v2 error rate 100.0% (20 of 20)" in text
    assert "v1 error rate 0.0% (0 of 200)" in text


def test_below_the_minimum_number_of_requests_nothing_is_judged() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 19, 19, 0.1)
    _feed(judge, False, 200, 0, 0.1)
    assert judge.verdict(1.0) is None
    _feed(judge, True, 1, 1, 0.1)
    assert judge.verdict(1.0) is not None


def test_the_old_version_needs_the_minimum_too() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 100, 100, 0.1)
    _feed(judge, False, 19, 0, 0.1)
    assert judge.verdict(1.0) is None


def test_an_error_rate_within_the_margin_is_not_worse() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 100, 5, 0.1)  # 5% against 0%: at the margin, not past it
    _feed(judge, False, 100, 0, 0.1)
    assert judge.verdict(1.0) is None
    judge.observe(True, 1.0, False, None)  # 6 of 101
    assert judge.verdict(1.0) is not None


def test_a_p99_ttft_past_the_ratio_is_worse_and_one_within_it_is_not() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 50, 0, 0.2)
    _feed(judge, False, 50, 0, 0.1)
    assert judge.verdict(1.0) is None  # twice: at the ratio
    _feed(judge, True, 50, 0, 0.3)
    verdict = judge.verdict(1.0)
    assert verdict is not None
    assert "p99 TTFT" in verdict.reason
    assert verdict.new.p99_ttft_s == 0.3
    assert verdict.old.p99_ttft_s == 0.1


def test_attempts_older_than_the_window_are_forgotten() -> None:
    judge = Judge(RULES)
    _feed(judge, True, 50, 50, 0.1, t=0.0)
    _feed(judge, False, 50, 0, 0.1, t=0.0)
    assert judge.verdict(10.0) is not None
    assert judge.verdict(10.5) is None
    new, old = judge.figures(10.5)
    assert (new.requests, old.requests) == (0, 0)


Feed = tuple[bool, str, int, float]
"""Attempts that went well: (on the new version, card, how many, TTFT each)."""


def _verdict(*feeds: Feed) -> Verdict | None:
    judge = Judge(RULES)
    for new, card_name, n, ttft in feeds:
        for _ in range(n):
            judge.observe(new, 0.0, True, ttft, card_name)
    return judge.verdict(1.0)


def test_a_slow_new_version_on_a_strong_card_is_judged_against_that_card() -> None:
    # The old version's p99 over the whole fleet is its slow cards' tail; pooled, a new version
    # twice and a half as slow on an A100 hid behind the V100s (0.5 s against 0.3 s).
    verdict = _verdict(
        (True, "A100-80GB", 30, 0.5), (False, "A100-80GB", 60, 0.2), (False, "V100-32GB", 40, 0.3)
    )
    assert verdict is not None
    assert verdict.reason == "p99 TTFT more than 2 times the old one's on A100-80GB"
    assert (verdict.new.requests, verdict.old.requests) == (30, 60)
    assert (verdict.new.p99_ttft_s, verdict.old.p99_ttft_s) == (0.5, 0.2)


def test_a_canary_on_a_weak_card_is_not_worse_for_its_card_alone() -> None:
    feeds = (True, "V100-32GB", 30, 0.6), (False, "V100-32GB", 40, 0.5)
    assert _verdict(*feeds, (False, "A100-80GB", 200, 0.2)) is None


def test_each_card_both_versions_ran_is_judged() -> None:
    a100 = (True, "A100-80GB", 30, 0.2), (False, "A100-80GB", 30, 0.2)
    verdict = _verdict(*a100, (True, "V100-32GB", 30, 1.5), (False, "V100-32GB", 30, 0.5))
    assert verdict is not None
    assert verdict.reason.endswith("on V100-32GB")


def test_without_a_card_both_versions_ran_enough_the_versions_are_compared_whole() -> None:
    # The canary's card has too few of the old version's requests: compared across cards.
    verdict = _verdict(
        (True, "H100", 30, 0.5), (False, "H100", 5, 0.1), (False, "A100-80GB", 40, 0.2)
    )
    assert verdict is not None
    assert verdict.reason == "p99 TTFT more than 2 times the old one's"
    assert verdict.old.requests == 45


def test_a_replicas_card_is_its_gpu_model_and_count_or_the_one_nvml_names() -> None:
    a100, v100 = make_fleet([2.0, 1.0]).replicas
    assert card(Replica(0, a100, 2.0, 4)) == "A100-80GB"
    assert card(Replica(0, replace(a100, gpus=(0, 1)), 2.0, 4)) == "2 x A100-80GB"
    other = Replica(1, v100, 1.0, 4)
    other.telemetry = Telemetry(0.5, 0.0, gpu_name="NVIDIA H200")
    assert card(other) == "V100-32GB"  # not flagged: the fleet file's name stands
    other.gpu_mismatch = "NVML reports NVIDIA H200, fleet file says V100-32GB"
    assert card(other) == "NVIDIA H200"
