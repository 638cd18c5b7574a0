"""The simulated router knows what the live router would know, and nothing more.

It gets the fleet file as written, each engine's /metrics at the poll interval, the
``max_tokens`` its clients send, and its own accounting; an engine refuses a request it cannot
hold as the emulator (and vLLM) would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from router.config import load_fleet, parse_fleet
from router.config.schema import FleetConfig
from router.core import Assignment, CoreListener, Finished, Outcome
from router.emulator.replica import EmulatedReplica
from router.perf.profiles import default_catalog
from router.replica import EngineLoad
from router.sim import runner
from router.sim.engine import BLOCK_TOKENS, Sequence
from router.sim.runner import Workload, fleet_capacity, simulate, trace_rows
from router.sim.simulator import Simulation
from router.sim.workload import (
    Arrival,
    CappedMix,
    LognormalMix,
    TraceMix,
    bundled_trace,
    gamma,
    replay,
)

EXAMPLES = Path(__file__).parent.parent / "examples" / "fleets"
UNTUNED = """
cluster: untuned
model: meta-llama/Llama-3.1-8B-Instruct
nodes:
  - name: n
    gpus:
      - {index: 0, model: A100-80GB, memory_gib: 80}
      - {index: 1, model: L4, memory_gib: 24}
    replicas:
      - {id: a100, endpoint: "http://127.0.0.1:18998", gpus: [0]}
      - {id: l4, endpoint: "http://127.0.0.1:18999", gpus: [1]}
"""
"""Two cards, every setting left out: no KV capacity, no context length."""
MIXED = EXAMPLES / "mixed-a100-v100.yaml"


def _with_poll(fleet: FleetConfig, interval_s: float) -> FleetConfig:
    health = replace(fleet.router.health, engine_metrics_interval_s=interval_s)
    return replace(fleet, router=replace(fleet.router, health=health))


def _conv_arrivals(rate: float, duration: float, seed: int = 0) -> list[Arrival]:
    mix = TraceMix(bundled_trace("conv"))
    return list(gamma(rate, 1.0, duration, mix, random.Random(seed)))


# ---- the fleet file as written -------------------------------------------------------------


def test_the_simulated_router_has_no_kv_capacity_the_fleet_file_does_not_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``simulate`` hands the router the fleet file as written: a replica the file gives no
    KV capacity has none in the router's configuration, whatever its engine model holds."""
    built: list[Simulation] = []

    class Kept(Simulation):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(runner, "Simulation", Kept)
    fleet = parse_fleet(UNTUNED, "untuned.yaml")
    assert all(r.kv_capacity_tokens is None for r in fleet.replicas)
    simulate(fleet, "capacity-aware", Workload(trace_rows("conv")), 5.0, 10.0, 0, {})
    (sim,) = built
    assert [r.config for r in sim.core.pool] == list(fleet.replicas)
    assert all(r.config.kv_capacity_tokens is None for r in sim.core.pool)
    # The engines still have their caches: only the router does not know them up front.
    assert all(e.kv_capacity > 0 for e in sim.engines)


def test_a_kv_capacity_the_fleet_file_gives_is_kept_as_written() -> None:
    fleet = load_fleet(EXAMPLES / "h100-a100-l4.yaml")
    sim = Simulation(fleet, "capacity-aware")
    assert [r.config.kv_capacity_tokens for r in sim.core.pool] == [
        r.kv_capacity_tokens for r in fleet.replicas
    ]


# ---- the engines' /metrics at the poll interval ---------------------------------------------


@dataclass
class _Readings:
    """What each poll set, next to the engine model's own state at that moment."""

    taken: list[tuple[float, str, EngineLoad, tuple[int, int, float, int, int]]] = field(
        default_factory=list
    )


def _watch_polls(sim: Simulation, times: list[float]) -> _Readings:
    """At each time, note the engines' state, then (after the poll due then) what was set."""
    seen = _Readings()
    state: dict[str, tuple[int, int, float, int, int]] = {}

    def before(t: float) -> None:
        for r, e in zip(sim.core.pool, sim.engines, strict=True):
            state[r.id] = (len(e.waiting), e.running, e.kv_usage, e.kv_capacity, e.preemptions)
        # Registered now, it runs after the poll event already due at this same time.
        sim.at(t, partial(after, t))

    def after(t: float) -> None:
        for r in sim.core.pool:
            assert r.engine is not None
            seen.taken.append((t, r.id, r.engine, state[r.id]))

    for t in times:
        sim.at(t, partial(before, t))
    return seen


def test_simulated_engine_metrics_arrive_each_interval_with_the_engines_values() -> None:
    """Every ``engine_metrics_interval_s`` each replica's ``engine`` is a fresh vLLM reading
    of its engine model: waiting, running, KV usage, KV size in whole blocks, preemptions."""
    sim = Simulation(_with_poll(load_fleet(MIXED), 2.0), "least-connections", seed=1)
    seen = _watch_polls(sim, [2.0, 10.0, 20.0])
    sim.run(_conv_arrivals(30.0, 30.0), 30.0)
    assert {t for t, *_ in seen.taken} == {2.0, 10.0, 20.0}
    busy = 0
    for t, _, load, (waiting, running, kv_usage, kv_capacity, preemptions) in seen.taken:
        assert load.engine == "vllm"
        assert load.received_at == t
        assert (load.waiting, load.running, load.kv_usage) == (waiting, running, kv_usage)
        assert load.kv_capacity_tokens == kv_capacity // BLOCK_TOKENS * BLOCK_TOKENS
        assert load.preemptions_total == preemptions
        busy += running > 0
    assert busy > 0  # the readings were taken under load, not only of idle engines


def test_between_polls_a_reading_ages_and_is_not_refreshed() -> None:
    sim = Simulation(_with_poll(load_fleet(MIXED), 4.0), "least-connections", seed=1)
    ages: list[float] = []

    def note() -> None:
        for r in sim.core.pool:
            assert r.engine is not None
            ages.append(sim.clock.now - r.engine.received_at)

    sim.at(7.0, note)  # polls at 0, 4, 8: the reading at 7 is from 4
    sim.run(_conv_arrivals(20.0, 10.0), 10.0)
    assert ages == [pytest.approx(3.0)] * len(sim.core.pool)


def test_with_the_interval_at_0_the_engines_metrics_are_never_read() -> None:
    """As the live poller with ``engine_metrics_interval_s: 0``."""
    sim = Simulation(_with_poll(load_fleet(MIXED), 0.0), "least-connections", seed=1)
    sim.run(_conv_arrivals(20.0, 10.0), 10.0)
    assert all(r.engine is None for r in sim.core.pool)


def test_polling_stops_when_the_run_is_idle_and_the_run_stays_deterministic() -> None:
    def once() -> tuple[object, list[float]]:
        sim = Simulation(_with_poll(load_fleet(MIXED), 2.0), "capacity-aware", seed=3)
        result = sim.run(_conv_arrivals(20.0, 20.0, seed=3), 20.0)
        return result, [r.engine.received_at for r in sim.core.pool if r.engine is not None]

    (a, last_a), (b, last_b) = once(), once()
    assert a == b
    assert last_a == last_b
    # The run ended (no poll kept it going) within one interval of its last work.
    assert max(last_a) < 20.0 + 60.0


def test_a_killed_replica_answers_no_poll_and_its_last_reading_ages() -> None:
    sim = Simulation(_with_poll(load_fleet(MIXED), 2.0), "least-connections", seed=1)
    sim.at(5.0, lambda: sim.kill("v100-0"))
    stamps: dict[str, float] = {}

    def note() -> None:
        for r in sim.core.pool:
            assert r.engine is not None
            stamps[r.id] = r.engine.received_at

    sim.at(9.0, note)
    sim.run(_conv_arrivals(20.0, 10.0), 10.0)
    assert stamps["v100-0"] == 4.0
    assert stamps["v100-1"] == 8.0


# ---- max_tokens as clients send it ---------------------------------------------------------


class _Sent(Simulation):
    """Notes, per request, the max_tokens the router saw and the length its engine generates."""

    sent: dict[str, tuple[int, int]]

    def on_assign(self, a: Assignment) -> None:
        engine = self.engines[a.replica.index]
        before = engine.add

        def add(seq: Sequence) -> None:
            self.sent[seq.id] = (a.request.max_tokens, seq.output_tokens)
            before(seq)

        engine.add = add  # type: ignore[method-assign]  # for this one assignment
        try:
            super().on_assign(a)
        finally:
            del engine.add


def test_with_max_tokens_1024_requests_carry_1024_but_generate_their_trace_lengths() -> None:
    rows = trace_rows("conv")
    capped = Workload(rows, max_tokens=1024)
    own = Workload(rows)
    arrivals = list(capped.generate(10.0, 30.0, 5))
    # The same draws as without a cap; only what the client sends differs.
    assert [(a.time, a.prompt_tokens, a.output_tokens) for a in arrivals] == [
        (a.time, a.prompt_tokens, a.output_tokens) for a in own.generate(10.0, 30.0, 5)
    ]
    assert {a.max_tokens for a in arrivals} == {1024}
    sim = _Sent(load_fleet(MIXED), "least-connections", seed=5)
    sim.sent = {}
    result = sim.run(arrivals, 30.0)
    assert result.completed == len(arrivals)
    assert len(sim.sent) == len(arrivals)
    assert {m for m, _ in sim.sent.values()} == {1024}
    generated = sorted(o for _, o in sim.sent.values())
    assert generated == sorted(a.output_tokens for a in arrivals)
    assert len(set(generated)) > 10  # the trace's lengths, not the cap


def test_by_default_a_client_sends_its_requests_own_output_length() -> None:
    arrivals = list(Workload(trace_rows("conv")).generate(10.0, 30.0, 5))
    assert all(a.max_tokens == a.output_tokens for a in arrivals)
    sim = _Sent(load_fleet(MIXED), "least-connections", seed=5)
    sim.sent = {}
    sim.run(arrivals, 30.0)
    assert all(m == o for m, o in sim.sent.values())


def test_a_cap_below_a_trace_length_cuts_what_the_engine_generates() -> None:
    rows = trace_rows("conv")
    arrivals = list(Workload(rows, max_tokens=64).generate(10.0, 30.0, 5))
    assert {a.max_tokens for a in arrivals} == {64}
    assert max(a.output_tokens for a in arrivals) == 64
    assert any(a.output_tokens < 64 for a in arrivals)
    replayed = list(replay(rows, 10.0, 30.0, max_tokens=64))
    assert all(a.max_tokens == 64 and a.output_tokens <= 64 for a in replayed)


def test_the_capacity_is_measured_on_what_the_engines_generate() -> None:
    """A cap shortens the answers engines write, so a replica completes more of them."""
    rows = trace_rows("conv")
    fleet = load_fleet(MIXED)
    free = fleet_capacity(fleet, Workload(rows).mix)
    capped = fleet_capacity(fleet, Workload(rows, max_tokens=64).mix)
    assert capped["a100-0"] > free["a100-0"]
    assert Workload(rows, max_tokens=64).mix.mean_output <= 64
    lognormal = Workload(rows, lengths="lognormal", max_tokens=64).mix
    assert lognormal.mean_output <= 64
    assert lognormal.mean_output == Workload(rows, "poisson", 1.0, "lognormal", 64).mix.mean_output


def test_a_max_tokens_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Workload(trace_rows("conv"), max_tokens=0)


def test_a_capped_mix_draws_as_its_source_and_only_cuts_the_outputs() -> None:
    mix = LognormalMix((100, 200), (50, 80))
    cut = CappedMix(mix, 10)
    rng_a, rng_b = random.Random(1), random.Random(1)
    for _ in range(100):
        p, o = mix.sample(rng_a)
        assert cut.sample(rng_b) == (p, min(o, 10))


# ---- a request the engine cannot hold --------------------------------------------------------


class _Endings(CoreListener):
    def __init__(self) -> None:
        self.finished: list[Finished] = []

    def on_finish(self, finished: Finished) -> None:
        self.finished.append(finished)


def _one_replica(gpu: str, model: str) -> FleetConfig:
    text = f"""
cluster: t
model: {model}
router:
  health: {{engine_metrics_interval_s: 0}}
nodes:
  - name: n
    gpus: [{{index: 0, model: {gpu}, memory_gib: 80}}]
    replicas:
      - {{id: r0, endpoint: "http://127.0.0.1:18999", gpus: [0]}}
"""
    return parse_fleet(text, "test.yaml")


@pytest.mark.parametrize(
    ("gpu", "model"),
    [("A100-80GB", "Llama-2-7B"), ("L4", "Llama-3.1-8B")],
    ids=["context-bound", "kv-bound"],
)
def test_a_request_past_what_the_engine_holds_is_refused_as_the_emulator_refuses_it(
    gpu: str, model: str
) -> None:
    """The router knows neither the model's context nor the card's KV cache (no fleet file
    figure, no engine metrics): a request longer than the emulator takes for this replica
    fails with the engine's 400 at once, not retried, instead of waiting forever; one at the
    limit completes."""
    fleet = _one_replica(gpu, model)
    (config,) = fleet.replicas
    emulated = EmulatedReplica(config, default_catalog(), host="127.0.0.1", port=0)
    limit = min(emulated.max_model_len, emulated.kv_limit_tokens)
    sim = Simulation(fleet, "least-connections")
    endings = _Endings()
    sim.core.listeners.append(endings)
    fits = Arrival(0.1, limit - 100, 10, 100)
    too_long = Arrival(0.2, limit - 100, 10, 101)
    result = sim.run([fits, too_long], 10.0)
    assert result.lost_requests == 0
    assert result.unfinished == 0
    assert [f.outcome for f in endings.finished] == [Outcome.FAILED, Outcome.COMPLETED]
    refused = endings.finished[0]
    assert refused.request.attempts == 1
    assert "400" in refused.reason
    assert "context_length_exceeded" in refused.reason
    assert refused.time == pytest.approx(0.2 + 0.001)
    # Not the replica's fault: the health monitor does not count it towards ejection.
    assert sim.core.pool.replicas[0].state.value == "active"
