"""The continuous-batching engine model: timing, batching, KV pressure, conservation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.sim.engine import Engine, Sequence


def flat_cost(prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:  # noqa: ARG001 (the StepCost signature)
    """A toy cost: 1 ms per prefill token, 10 ms per step with any decode."""
    return prefill_tokens * 0.001 + (0.01 if decode_seqs else 0.0)


def run_until_idle(
    engine: Engine, limit: int = 100_000
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Steps the engine to completion; returns elapsed time, first-token and finish times."""
    t = 0.0
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    for _ in range(limit):
        d = engine.start_step()
        if d == 0:
            break
        t += d
        out = engine.finish_step()
        first.update((s.id, t) for s in out.first_tokens)
        done.update((s.id, t) for s in out.finished)
    return t, first, done


def test_a_lone_request_prefills_then_decodes_one_token_per_step() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=10_000)
    engine.add(Sequence("a", prompt_tokens=100, output_tokens=5))
    _, first, done = run_until_idle(engine)
    assert first["a"] == 0.1  # 100 prompt tokens at 1 ms
    assert round(done["a"], 6) == round(0.1 + 4 * 0.01, 6)  # 4 more tokens, one per step
    assert engine.kv_used == 0
    assert engine.idle


def test_long_prompts_are_chunked_by_the_step_token_budget() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=100_000, max_batched_tokens=1000)
    engine.add(Sequence("a", prompt_tokens=2500, output_tokens=1))
    steps = 0
    while engine.start_step():
        engine.finish_step()
        steps += 1
    assert steps == 3


def test_decoding_sequences_share_steps() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=10_000)
    for i in range(4):
        engine.add(Sequence(f"s{i}", prompt_tokens=10, output_tokens=50))
    t, _, done = run_until_idle(engine)
    assert len(done) == 4
    # batched: about 50 steps in all, not 4 x 50
    assert t < 0.04 + 55 * 0.01


def test_max_num_seqs_makes_the_rest_wait() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=10_000, max_num_seqs=2)
    for i in range(3):
        engine.add(Sequence(f"s{i}", prompt_tokens=10, output_tokens=20))
    engine.start_step()
    engine.finish_step()
    assert engine.running == 2
    assert len(engine.waiting) == 1


def test_kv_pressure_preempts_the_youngest_and_everything_still_finishes() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=1_200, max_batched_tokens=4096)
    for i in range(6):
        engine.add(Sequence(f"s{i}", prompt_tokens=150, output_tokens=100))
    _, _, done = run_until_idle(engine)
    assert set(done) == {f"s{i}" for i in range(6)}
    assert engine.preemptions > 0
    assert engine.kv_used == 0
    assert engine.decode_context == 0


def test_a_cancelled_sequence_frees_its_cache() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=10_000)
    engine.add(Sequence("a", prompt_tokens=100, output_tokens=50))
    engine.add(Sequence("b", prompt_tokens=100, output_tokens=50))
    engine.start_step()
    engine.finish_step()
    assert engine.cancel("a") is not None
    _, _, done = run_until_idle(engine)
    assert set(done) == {"b"}
    assert engine.kv_used == 0


def test_a_cancel_during_a_step_takes_effect_when_the_step_ends() -> None:
    engine = Engine(flat_cost, kv_capacity_tokens=10_000)
    engine.add(Sequence("a", prompt_tokens=100, output_tokens=50))
    engine.start_step()
    assert engine.cancel("a") is None
    engine.finish_step()
    assert engine.idle
    assert engine.kv_used == 0


@settings(max_examples=150, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 80)), min_size=1, max_size=25),
    capacity=st.integers(500, 4000),
    max_seqs=st.integers(1, 16),
    budget=st.integers(64, 2048),
    cancels=st.lists(st.integers(0, 24), max_size=5),
)
def test_every_sequence_finishes_once_with_its_full_output_and_the_cache_balances(
    seqs: list[tuple[int, int]], capacity: int, max_seqs: int, budget: int, cancels: list[int]
) -> None:
    engine = Engine(
        flat_cost, kv_capacity_tokens=capacity, max_num_seqs=max_seqs, max_batched_tokens=budget
    )
    added = {}
    for i, (p, o) in enumerate(seqs):
        if p + o <= capacity:
            added[f"s{i}"] = Sequence(f"s{i}", p, o)
            engine.add(added[f"s{i}"])
    cancelled = set()
    finished: list[str] = []
    for c in cancels:
        engine.start_step()
        finished += [s.id for s in engine.finish_step().finished]
        if f"s{c}" in added and engine.cancel(f"s{c}") is not None:
            cancelled.add(f"s{c}")
    for _ in range(200_000):
        if not engine.start_step():
            break
        out = engine.finish_step()
        assert 0 <= engine.kv_used <= capacity
        finished += [s.id for s in out.finished]
    assert engine.idle
    assert engine.kv_used == 0
    assert len(finished) == len(set(finished))
    assert set(finished) == set(added) - cancelled
    assert all(added[f].generated == added[f].output_tokens for f in finished)


def context_cost(prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
    """A toy cost that reads every argument, so a wrong decode context shows in the clock."""
    return 0.001 * prefill_tokens + 0.004 * decode_seqs + 3e-6 * decode_context_tokens + 0.01


def closed_loop(
    engine: Engine, lengths: list[tuple[int, int]], quiet: bool
) -> tuple[list[object], int]:
    """Keeps the engine full from ``lengths`` (cycled), stepping one step at a time or with
    ``run_quiet_steps`` between; returns every finish, its step and clock, and the end state,
    and how many steps ``run_quiet_steps`` ran."""
    fed = quiet_steps = 0

    def feed() -> None:
        nonlocal fed
        p, o = lengths[fed % len(lengths)]
        engine.add(Sequence(f"s{fed}", p, o))
        fed += 1

    for _ in range(len(lengths)):
        feed()
    clock = 0.0
    trace: list[object] = []
    while fed < 4 * len(lengths):
        if quiet:
            before = engine.step_no
            clock = engine.run_quiet_steps(clock)
            quiet_steps += engine.step_no - before
        step = engine.start_step()
        assert step > 0
        clock += step
        out = engine.finish_step()
        assert 0 <= engine.kv_used <= engine.kv_capacity
        for seq in out.finished:
            trace.append((seq.id, engine.step_no, clock))
            feed()
    trace.append((engine.step_no, engine.kv_used, engine.decode_context, engine.busy_seconds))
    trace.append(engine.preemptions)
    return trace, quiet_steps


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 120)), min_size=1, max_size=12),
    capacity=st.integers(800, 6000),
    max_seqs=st.integers(1, 16),
    budget=st.integers(64, 1024),
)
def test_quiet_steps_run_at_once_give_the_same_floats_as_one_at_a_time(
    lengths: list[tuple[int, int]], capacity: int, max_seqs: int, budget: int
) -> None:
    """The fast path skips only bookkeeping: every finish comes at the same step and the same
    clock, to the bit, through admissions, prefill chunks and preemptions."""
    lengths = [(p, o) for p, o in lengths if p + o <= capacity // 2] or [(10, 10)]

    def make() -> Engine:
        return Engine(
            context_cost,
            kv_capacity_tokens=capacity,
            max_num_seqs=max_seqs,
            max_batched_tokens=budget,
        )

    assert closed_loop(make(), lengths, quiet=True)[0] == closed_loop(make(), lengths, False)[0]


def test_a_full_cache_keeps_the_queue_waiting_through_quiet_steps_and_preempts_on_time() -> None:
    """Eight long requests in a cache that holds about five: admission stops on the cache and
    decoding outgrows it; the fast path stops short of both and gives the same run."""

    def make() -> Engine:
        return Engine(context_cost, kv_capacity_tokens=1200, max_num_seqs=8)

    lengths = [(100, 150)] * 8
    (fast, quiet_steps), (slow, _) = (
        closed_loop(make(), lengths, True),
        closed_loop(make(), lengths, False),
    )
    assert fast == slow
    assert quiet_steps > len(fast)  # most steps went the fast way
    assert fast[-1] != 0  # the run did preempt
