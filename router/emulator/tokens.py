"""Token counts without a tokenizer, and the filler text emulated replicas generate.

The emulator never runs a model, so it needs neither a tokenizer nor real text: only counts
that are deterministic and about right. English averages about four characters per token in
the Llama and GPT tokenizers, so a prompt of ``c`` characters counts as ``ceil(c / 4)``.
"""

from __future__ import annotations

import functools
import math
import random

__all__ = ["default_output_tokens", "estimate_tokens", "filler_text", "filler_token"]

_WORDS = (" the", " GPU", " runs", " fast", " and", " the", " KV", " cache", " holds", " it")
"""Filler tokens; four characters each on average, so the text re-counts to its length."""


def estimate_tokens(text: str) -> int:
    """Tokens in ``text``: ``ceil(len / 4)``, at least 1 (an empty prompt still has BOS)."""
    return max(1, math.ceil(len(text) / 4))


def filler_token(i: int) -> str:
    """The text of the ``i``-th generated token (0-based)."""
    return _WORDS[i % len(_WORDS)]


def filler_text(n: int) -> str:
    """The text of ``n`` generated tokens."""
    return "".join(filler_token(i) for i in range(n))


@functools.cache
def _conv_outputs() -> tuple[int, ...]:
    # Imported here: reading the trace costs a few hundred milliseconds, paid only by
    # requests that name no length at all.
    from router.sim.workload import bundled_trace

    return tuple(row.output_tokens for row in bundled_trace("conv"))


def default_output_tokens(rng: random.Random) -> int:
    """An output length drawn from the bundled conversation trace (Azure LLM 2023)."""
    outputs = _conv_outputs()
    return outputs[rng.randrange(len(outputs))]
