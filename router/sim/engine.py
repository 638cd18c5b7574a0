"""A continuous-batching inference engine in virtual time, as vLLM schedules one.

One instance stands for one replica. Each step the engine decodes one token for every running
sequence that has finished its prefill, and spends what is left of the step's token budget on
prefill (chunked, as vLLM's default scheduler does), admitting waiting sequences while the
max-sequences limit and the KV budget allow. When the KV cache cannot hold the next tokens the
youngest running sequence is preempted and later recomputed (its prompt and the tokens it had
generated are prefilled again), as vLLM does. How long a step takes comes from the performance
model through a ``StepCost`` function.

The per-step bookkeeping is O(1) plus O(log n) per sequence that starts or finishes, so the
simulator can run many thousands of requests per wall-clock second.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

BLOCK_TOKENS = 16
"""Tokens per KV-cache block (vLLM's default block size)."""
DEFAULT_MAX_BATCHED_TOKENS = 8192
"""Tokens one step processes at most, decode and prefill chunks together (vLLM's default
``max_num_batched_tokens`` for online serving)."""


class StepCost(Protocol):
    def __call__(self, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
        """Seconds one engine step takes."""
        ...


@dataclass(slots=True, eq=False)
class Sequence:
    id: str
    prompt_tokens: int
    output_tokens: int
    need: int = 0
    """Tokens to prefill before decoding (the prompt; more after a recompute)."""
    prefilled: int = 0
    generated: int = 0
    """Tokens emitted so far (the first comes out of prefill)."""
    decode_base_step: int = 0
    decode_base_generated: int = 0
    admitted: int = 0
    """Admission order, for choosing the youngest to preempt."""
    preemptions: int = 0
    """Times this sequence was preempted for recompute."""

    def __post_init__(self) -> None:
        self.need = self.need or self.prompt_tokens


@dataclass(slots=True)
class StepOutcome:
    first_tokens: list[Sequence] = field(default_factory=list)
    """Sequences whose first output token came out in this step."""
    finished: list[Sequence] = field(default_factory=list)
    preempted: int = 0


class Engine:
    def __init__(
        self,
        cost: StepCost,
        *,
        kv_capacity_tokens: int,
        max_num_seqs: int = 256,
        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    ) -> None:
        self.cost = cost
        self.kv_capacity = kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: dict[str, Sequence] = {}
        self._finish_heap: list[tuple[int, int, Sequence]] = []
        self.step_no = 0
        self.kv_used = 0
        self.decode_context = 0
        self._admitted = 0
        self._plan: tuple[int, list[tuple[Sequence, int]]] | None = None
        self.busy_seconds = 0.0
        self.preemptions = 0
        self._cancel_after_step: list[str] = []
        self._planned_kv = 0

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.decoding)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity

    @property
    def step_prefill_tokens(self) -> int:
        """Prompt tokens the step composed by ``start_step`` prefills (0 between steps)."""
        return 0 if self._plan is None else sum(n for _, n in self._plan[1])

    def add(self, seq: Sequence) -> None:
        if seq.prompt_tokens + seq.output_tokens > self.kv_capacity:
            raise ValueError(f"{seq.id} needs more KV cache than the replica has")
        self.waiting.append(seq)

    def cancel(self, seq_id: str) -> Sequence | None:
        """Drop a sequence wherever it is (a cancelled request); frees its KV cache.

        During a step the sequence is dropped when the step ends, as a real engine would.
        """
        if self._plan is not None:
            self._cancel_after_step.append(seq_id)
            return None
        seq = self.decoding.pop(seq_id, None)
        if seq is not None:
            ctx = self._context(seq)
            self.kv_used -= ctx
            self.decode_context -= ctx
            return seq
        for group in (self.prefilling, self.waiting):
            for s in group:
                if s.id == seq_id:
                    group.remove(s)
                    self.kv_used -= s.prefilled
                    return s
        return None

    def start_step(self) -> float:
        """Compose the next step; returns its duration in seconds (0 when idle)."""
        preempted = self._make_room(len(self.decoding))
        budget = self.max_batched_tokens - len(self.decoding)
        # KV cache this step will hold once its decode tokens and prefill chunks are written.
        self._planned_kv = self.kv_used + len(self.decoding)
        chunks: list[tuple[Sequence, int]] = []
        for seq in self.prefilling:
            budget -= self._chunk(seq, budget, chunks)
        # As vLLM: no admissions in a step that had to preempt, and a new sequence must leave
        # a watermark of free blocks for the running ones to grow into; otherwise admitted
        # prompts fill the cache and every step preempts what the last one admitted.
        reserve = self.kv_capacity // 100 + BLOCK_TOKENS * len(self.decoding)
        while self.waiting and budget > 0 and self.running < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            if self._planned_kv + seq.need + reserve > self.kv_capacity:
                break
            self.waiting.popleft()
            self._admitted += 1
            seq.admitted = self._admitted
            self.prefilling.append(seq)
            budget -= self._chunk(seq, budget, chunks)
        prefill = sum(n for _, n in chunks)
        if not prefill and not self.decoding:
            self._plan = None
            return 0.0
        self._plan = (len(self.decoding), chunks)
        duration = self.cost(prefill, len(self.decoding), self.decode_context)
        self.busy_seconds += duration
        return duration

    def finish_step(self) -> StepOutcome:
        """Apply the step composed by ``start_step``."""
        out = StepOutcome()
        if self._plan is None:
            return out
        n_decode, chunks = self._plan
        self._plan = None
        self.step_no += 1
        self.kv_used += n_decode
        self.decode_context += n_decode
        heap = self._finish_heap
        while heap and heap[0][0] <= self.step_no:
            _, admitted, seq = heapq.heappop(heap)
            # An entry from before a preemption is stale: the sequence was admitted again.
            if self.decoding.get(seq.id) is seq and seq.admitted == admitted:
                self._retire(seq, out)
        for seq, n in chunks:
            seq.prefilled += n
            self.kv_used += n
            if seq.prefilled >= seq.need:
                self.prefilling.remove(seq)
                self._begin_decode(seq, out)
        cancelled, self._cancel_after_step = self._cancel_after_step, []
        for seq_id in cancelled:
            self.cancel(seq_id)
        return out

    def run_quiet_steps(self, clock: float) -> float:
        """Run the steps from here that only decode: no prefill, no admission, no preemption
        and no sequence finishing. ``clock`` plus each step's duration in turn is returned.

        Such steps are most of a closed loop's (a request of 256 tokens decodes 255 of them),
        and ``start_step`` and ``finish_step`` do the bookkeeping of a step that could do
        anything; these change only the step count and the KV the decoders grow into. Each
        step's duration and every sum are the same floats, added in the same order, as
        stepping one at a time gives, so a measured capacity does not move by a bit.
        """
        steps = self._quiet_steps()
        n = len(self.decoding)
        cost, context, busy = self.cost, self.decode_context, self.busy_seconds
        for _ in range(steps):
            duration = cost(0, n, context)
            busy += duration
            clock += duration
            context += n
        self.step_no += steps
        self.kv_used += steps * n
        self.decode_context = context
        self.busy_seconds = busy
        return clock

    def _quiet_steps(self) -> int:
        """How many steps from here only decode (see ``run_quiet_steps``)."""
        n = len(self.decoding)
        if self._plan is not None or self._cancel_after_step or self.prefilling or not n:
            return 0
        heap = self._finish_heap
        # A step ending at step_no + k retires the entries due by then (stale ones included:
        # the step that meets them does the checking).
        steps = heap[0][0] - self.step_no - 1 if heap else 0
        # Each step writes n tokens; one that would not fit preempts.
        steps = min(steps, (self.kv_capacity - self.kv_used) // n)
        if self.waiting and n < self.max_num_seqs and self.max_batched_tokens > n:
            # (n is all that runs: nothing prefills.) Only a cache too full to admit the
            # head keeps it waiting, and decoding only fills the cache further.
            reserve = self.kv_capacity // 100 + BLOCK_TOKENS * n
            if self.kv_used + n + self.waiting[0].need + reserve <= self.kv_capacity:
                return 0
        return max(steps, 0)

    def _chunk(self, seq: Sequence, budget: int, chunks: list[tuple[Sequence, int]]) -> int:
        n = min(seq.need - seq.prefilled, budget, self.kv_capacity - self._planned_kv)
        if n > 0:
            chunks.append((seq, n))
            self._planned_kv += n
            return n
        return 0

    def _begin_decode(self, seq: Sequence, out: StepOutcome) -> None:
        if seq.generated == 0:
            seq.generated = 1
            out.first_tokens.append(seq)
        if seq.generated >= seq.output_tokens:
            self.kv_used -= seq.prefilled
            out.finished.append(seq)
            return
        seq.decode_base_step = self.step_no
        seq.decode_base_generated = seq.generated
        self.decoding[seq.id] = seq
        self.decode_context += self._context(seq)
        done_at = self.step_no + seq.output_tokens - seq.generated
        heapq.heappush(self._finish_heap, (done_at, seq.admitted, seq))

    def _retire(self, seq: Sequence, out: StepOutcome) -> None:
        seq.generated = seq.output_tokens
        ctx = seq.need + seq.output_tokens - seq.decode_base_generated
        del self.decoding[seq.id]
        self.kv_used -= ctx
        self.decode_context -= ctx
        out.finished.append(seq)

    def _context(self, seq: Sequence) -> int:
        return seq.need + (self.step_no - seq.decode_base_step)

    def _make_room(self, new_tokens: int) -> bool:
        """Preempt until the step's decode tokens fit; True if anything was preempted."""
        # Under KV pressure the youngest decoding sequence gives way and is recomputed later.
        preempted = False
        while self.decoding and self.kv_used + new_tokens > self.kv_capacity:
            preempted = True
            youngest = max(self.decoding.values(), key=lambda s: s.admitted)
            ctx = self._context(youngest)
            youngest.generated = youngest.decode_base_generated + (
                self.step_no - youngest.decode_base_step
            )
            del self.decoding[youngest.id]
            self.kv_used -= ctx
            self.decode_context -= ctx
            youngest.need = youngest.prompt_tokens + youngest.generated
            youngest.prefilled = 0
            self.waiting.appendleft(youngest)
            youngest.preemptions += 1
            self.preemptions += 1
            new_tokens -= 1
        return preempted
