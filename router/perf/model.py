"""The performance model: what one engine step costs, and what a replica sustains.

Times are in seconds, sizes in bytes, rates per second. ``F`` is the deployment's effective
compute rate and ``B`` its effective memory bandwidth::

    F = peak_flops * k * mfu       * tp_efficiency ** log2(k)      (k = tensor-parallel GPUs)
    B = bandwidth  * k * bandwidth_efficiency * tp_efficiency ** log2(k)

    weight_bytes        = params * dtype_bytes
    kv_bytes_per_token  = 2 * layers * kv_heads * head_dim * dtype_bytes     (K and V)
    kv_capacity_tokens  = (k * gpu_memory * mem_fraction - weight_bytes) / kv_bytes_per_token

One engine step runs every running sequence once: a decoding sequence computes one new token
over its cached context; a sequence in prefill computes a chunk of ``n`` prompt tokens (over
``c`` tokens already cached, 0 unless the prompt is chunked). With ``T`` the new tokens of all
sequences, ``C`` the cached tokens of all sequences and ``A`` the prefill chunks' attention
FLOPs::

    step = max(2 * params * T / F, weight_bytes / B)    the matrix products: compute or weights
         + kv_bytes_per_token * C / B                   attention reading the KV cache
         + A / F,   A = sum of 2 * layers * attention_heads * head_dim * n * (2c + n)

A lone prefill of ``n`` tokens is then ``~ 2 * params * n / F`` (compute-bound) and a decode
step over ``b`` sequences of context ``c`` is ``~ (weight_bytes + kv_bytes_per_token * b * c)
/ B`` (memory-bound) until ``2 * params * b / F`` outgrows the weight read. Prefill chunks
ride in the same step as decodes (chunked prefill), sharing its one read of the weights.

Tensor parallelism splits weights, KV cache, FLOPs and bandwidth over ``k`` GPUs; the
all-reduces it adds cost ``tp_efficiency`` per doubling of ``k``. A bf16 model on a card
without bf16 (V100, T4) runs as fp16: same bytes, the card's fp16 rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from router.errors import GpuRouterError
from router.perf.profiles import GpuProfile, ModelProfile

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_MAX_NUM_SEQS",
    "DEFAULT_MEM_FRACTION",
    "Deployment",
    "Efficiency",
    "ModelDoesNotFit",
    "RunningSequence",
    "Saturation",
    "WorkloadMix",
    "batch_step_function",
    "batch_step_seconds",
    "compute_dtype",
    "decode_step_seconds",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "prefill_seconds",
    "saturation",
    "saturation_rps",
    "step_seconds",
    "weight_bytes",
]

DEFAULT_MEM_FRACTION = 0.9
"""Share of GPU memory the engine takes for weights and KV cache (vLLM's default)."""
DEFAULT_MAX_NUM_SEQS = 256
"""Most sequences an engine runs at once (vLLM's default ``max_num_seqs``)."""


class ModelDoesNotFit(GpuRouterError):  # noqa: N818 -- the name issue 7 gives it; others use it
    """A model's weights (or one request's KV cache) do not fit the GPUs it is placed on."""

    title = "model does not fit"


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How much of the datasheet figures an engine reaches; each is a fraction in (0, 1].

    The defaults were fitted once to published measurements; docs/performance-model.md
    shows the fit and the error of every row (bench/calibrate.py prints it).
    """

    mfu: float = 0.75
    """Share of peak FLOP/s reached by matrix products (model FLOPs utilization)."""
    bandwidth: float = 0.75
    """Share of datasheet memory bandwidth reached while reading weights and KV cache."""
    tensor_parallel: float = 0.9
    """Share kept per doubling of the tensor-parallel GPUs (the all-reduces' cost)."""

    def __post_init__(self) -> None:
        for name in ("mfu", "bandwidth", "tensor_parallel"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"Efficiency.{name} must be in (0, 1], got {value}")


DEFAULT_EFFICIENCY = Efficiency()


def weight_bytes(model: ModelProfile) -> int:
    """Bytes of the model's weights: params * dtype_bytes."""
    return model.params * model.dtype_bytes


def kv_bytes_per_token(model: ModelProfile) -> int:
    """KV-cache bytes one token holds across all layers: 2 * layers * kv_heads * head_dim *
    dtype_bytes (the 2 is K and V)."""
    return 2 * model.layers * model.kv_heads * model.head_dim * model.dtype_bytes


def compute_dtype(gpu: GpuProfile, model: ModelProfile) -> str:
    """The dtype the model runs in on ``gpu``: bf16 becomes fp16 on cards without bf16.

    Same bytes, so memory and bandwidth figures do not change; the card's fp16 rate applies.
    Engines either fall back to fp16 by themselves or must be told (vLLM: ``--dtype half``).
    """
    return "fp16" if model.dtype == "bf16" and not gpu.bf16 else model.dtype


def kv_capacity_tokens(
    gpu: GpuProfile,
    model: ModelProfile,
    tensor_parallel: int = 1,
    mem_fraction: float = DEFAULT_MEM_FRACTION,
) -> int:
    """Tokens the KV cache holds: (k * gpu_memory * mem_fraction - weight_bytes) /
    kv_bytes_per_token, rounded down; ModelDoesNotFit when the weights leave no room.

    Activations and CUDA graphs also take memory in a real engine; vLLM measures them and
    reports a few percent less than this.
    """
    usable = tensor_parallel * gpu.memory_bytes * mem_fraction
    free = usable - weight_bytes(model)
    if free < kv_bytes_per_token(model):
        raise ModelDoesNotFit(_no_room(gpu, model, tensor_parallel, mem_fraction, usable))
    return math.floor(free / kv_bytes_per_token(model))


def _no_room(
    gpu: GpuProfile, model: ModelProfile, tensor_parallel: int, mem_fraction: float, usable: float
) -> str:
    needed = weight_bytes(model) / (gpu.memory_bytes * mem_fraction)
    at_least = 2 ** math.ceil(math.log2(needed)) if needed > 1 else 0
    hint = f"; it needs tensor_parallel >= {at_least}" if at_least else ""
    return (
        f"{model.name} does not fit {tensor_parallel} x {gpu.name}: "
        f"{weight_bytes(model) / 1e9:.1f} GB of {model.dtype} weights against "
        f"{usable / 1e9:.1f} GB usable at mem_fraction {mem_fraction}{hint}"
    )


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model served on ``tensor_parallel`` GPUs of one kind: one replica's hardware.

    Building one checks that it fits; ModelDoesNotFit says why when it does not.
    """

    gpu: GpuProfile
    model: ModelProfile
    tensor_parallel: int = 1
    """GPUs the model is split over (tensor parallelism); 1 means one GPU."""
    mem_fraction: float = DEFAULT_MEM_FRACTION
    """Share of each GPU's memory the engine takes for weights and KV cache."""
    efficiency: Efficiency = field(default=DEFAULT_EFFICIENCY)
    max_model_len: int | None = None
    """Longest sequence the engine must hold; when set, the KV cache must hold one of them."""
    kv_limit: int | None = None
    """The KV cache's size where it is known (the engine's own figure, the fleet file's): the
    cache holds no more than this, whatever the memory would allow. A card the model reads
    with a larger cache than it has batches more in the model than on the card, and a rate
    measured at low concurrency, carried to saturation by the model's curve, reads high."""

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1 or self.model.attention_heads % self.tensor_parallel:
            raise ValueError(
                f"tensor_parallel must be >= 1 and divide {self.model.name}'s "
                f"{self.model.attention_heads} attention heads, got {self.tensor_parallel}"
            )
        if not 0 < self.mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.kv_limit is not None and self.kv_limit < 1:
            raise ValueError(f"kv_limit must be >= 1, got {self.kv_limit}")
        capacity = self.kv_capacity_tokens
        if self.max_model_len is not None and capacity < self.max_model_len:
            raise ModelDoesNotFit(
                f"{self.model.name} on {self.tensor_parallel} x {self.gpu.name}: the KV cache "
                f"holds {capacity} tokens, fewer than max_model_len {self.max_model_len}"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the replica's KV cache holds (all GPUs together)."""
        room = kv_capacity_tokens(self.gpu, self.model, self.tensor_parallel, self.mem_fraction)
        return room if self.kv_limit is None else min(room, self.kv_limit)

    @property
    def dtype(self) -> str:
        """The dtype the model actually runs in here (see :func:`compute_dtype`)."""
        return compute_dtype(self.gpu, self.model)

    @property
    def _tp_factor(self) -> float:
        return math.pow(self.efficiency.tensor_parallel, math.log2(self.tensor_parallel))

    @property
    def flops(self) -> float:
        """Effective compute rate of the whole replica, FLOP/s."""
        peak = self.gpu.peak_flops * self.tensor_parallel
        return peak * self.efficiency.mfu * self._tp_factor

    @property
    def bandwidth(self) -> float:
        """Effective memory bandwidth of the whole replica, bytes/s."""
        peak = self.gpu.bandwidth_bytes_per_s * self.tensor_parallel
        return peak * self.efficiency.bandwidth * self._tp_factor


# --- one engine step ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningSequence:
    """One sequence in an engine step: its cached context and, in prefill, its prompt chunk."""

    context_tokens: int
    """Tokens already in the KV cache."""
    prefill_tokens: int = 0
    """Prompt tokens this step computes; 0 means the sequence is decoding one token."""


@dataclass(frozen=True, slots=True)
class _StepLoad:
    """What one step computes and reads, summed over its sequences."""

    new_tokens: float
    """Tokens through the matrix products (prompt chunks plus one per decoding sequence)."""
    cached_tokens: float
    """Tokens whose K and V are read from memory."""
    attention_flops: float
    """Attention FLOPs of the prompt chunks (decode attention is counted as a memory read)."""


def _prefill_attention_flops(model: ModelProfile, new: float, cached: float) -> float:
    """Causal attention of ``new`` tokens over ``cached`` + themselves: QK^T and AV."""
    return 2.0 * model.layers * model.query_width * new * (2.0 * cached + new)


def _step_time(deployment: Deployment, load: _StepLoad) -> float:
    model = deployment.model
    matmuls = max(
        2.0 * model.params * load.new_tokens / deployment.flops,
        weight_bytes(model) / deployment.bandwidth,
    )
    kv_read = kv_bytes_per_token(model) * load.cached_tokens / deployment.bandwidth
    return matmuls + kv_read + load.attention_flops / deployment.flops


def step_seconds(deployment: Deployment, sequences: Iterable[RunningSequence]) -> float:
    """Seconds one engine step takes for ``sequences`` (mixed prefill and decode).

    See the module docstring for the formula. An empty step costs nothing.
    """
    new = cached = attention = 0.0
    for seq in sequences:
        cached += seq.context_tokens
        if seq.prefill_tokens:
            new += seq.prefill_tokens
            attention += _prefill_attention_flops(
                deployment.model, seq.prefill_tokens, seq.context_tokens
            )
        else:
            new += 1
    if not new:
        return 0.0
    return _step_time(deployment, _StepLoad(new, cached, attention))


def batch_step_seconds(
    deployment: Deployment, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int
) -> float:
    """Seconds of one step from totals alone: O(1), for simulators that step millions of times.

    ``prefill_tokens`` prompt tokens (their attention counted as one chunk over no cache, a
    lower bound), ``decode_seqs`` decoding sequences whose contexts sum to
    ``decode_context_tokens``.
    """
    new = prefill_tokens + decode_seqs
    if not new:
        return 0.0
    attention = _prefill_attention_flops(deployment.model, prefill_tokens, 0.0)
    return _step_time(deployment, _StepLoad(new, decode_context_tokens, attention))


class StepFunction(Protocol):
    """Seconds of one engine step from its totals (``batch_step_seconds``'s arguments)."""

    def __call__(self, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
        """Seconds the step takes."""
        ...


def batch_step_function(deployment: Deployment) -> StepFunction:
    """``batch_step_seconds`` for one deployment, its constants worked out once: the
    simulator, the emulator and every capacity prior step an engine millions of times, and
    the deployment's properties (compute and bandwidth with their tensor-parallel factor,
    the model's byte counts) cost more than the step's own arithmetic. The same operations in
    the same order, so the same floats."""
    model = deployment.model
    flops, bandwidth = deployment.flops, deployment.bandwidth
    two_params = 2.0 * model.params
    weights_s = weight_bytes(model) / bandwidth
    kv_bytes = kv_bytes_per_token(model)
    attention = 2.0 * model.layers * model.query_width

    def step(prefill_tokens: int, decode_seqs: int, decode_context_tokens: int) -> float:
        new = prefill_tokens + decode_seqs
        if not new:
            return 0.0
        matmuls = max(two_params * new / flops, weights_s)
        kv_read = kv_bytes * decode_context_tokens / bandwidth
        return matmuls + kv_read + attention * prefill_tokens * prefill_tokens / flops

    return step


def prefill_seconds(deployment: Deployment, prompt_tokens: int, cached_tokens: int = 0) -> float:
    """Seconds to prefill one prompt alone (its time to first token on an idle replica)."""
    return step_seconds(deployment, [RunningSequence(cached_tokens, prompt_tokens)])


def decode_step_seconds(deployment: Deployment, batch: int, context_tokens: float) -> float:
    """Seconds of one decode step for ``batch`` sequences of ``context_tokens`` each (a mean
    is exact: the KV read is linear in context)."""
    if batch <= 0:
        return 0.0
    return _step_time(deployment, _StepLoad(batch, batch * context_tokens, 0.0))


# --- what a replica sustains --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """Mean request shape of a workload."""

    prompt_tokens: float
    output_tokens: float

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.output_tokens < 1:
            raise ValueError(
                "a workload needs prompt_tokens >= 0 and output_tokens >= 1, got "
                f"{self.prompt_tokens} and {self.output_tokens}"
            )

    @property
    def mean_context_tokens(self) -> float:
        """Mean context of a running request: its prompt plus half its output."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True, slots=True)
class Saturation:
    """A replica's steady state when it always has work (continuous batching)."""

    batch: int
    """Sequences running at once: max_num_seqs, or fewer when the KV cache limits it."""
    kv_limited: bool
    """True when the KV cache, not max_num_seqs, sets the batch."""
    step_seconds: float
    """Mean engine step."""
    rps: float
    """Requests completed per second: the replica's capacity at this mix."""
    output_tokens_per_s: float
    """Generated tokens per second."""


def saturation(
    deployment: Deployment, mix: WorkloadMix, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
) -> Saturation:
    """The replica's saturation throughput at ``mix``.

    ``batch = min(max_num_seqs, kv_capacity_tokens // mean_context_tokens)``. Each request
    decodes for ``output_tokens`` steps, so ``batch / output_tokens`` requests finish and as
    many start in a mean step; their prompts ride in that step as prefill chunks. The mean
    step is the step formula over ``batch`` decodes at the mean context plus those chunks,
    and ``rps = batch / (output_tokens * step)``. ModelDoesNotFit when one request of the
    mean shape does not fit the KV cache.
    """
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    capacity = deployment.kv_capacity_tokens
    if capacity < mix.prompt_tokens + mix.output_tokens:
        raise ModelDoesNotFit(
            f"{deployment.model.name} on {deployment.tensor_parallel} x {deployment.gpu.name}: "
            f"the KV cache holds {capacity} tokens, less than one request of "
            f"{mix.prompt_tokens:g} + {mix.output_tokens:g} tokens"
        )
    kv_batch = math.floor(capacity / mix.mean_context_tokens)
    batch = min(max_num_seqs, kv_batch)
    starts = batch / mix.output_tokens
    load = _StepLoad(
        new_tokens=batch + starts * mix.prompt_tokens,
        cached_tokens=batch * mix.mean_context_tokens,
        attention_flops=starts * _prefill_attention_flops(deployment.model, mix.prompt_tokens, 0.0),
    )
    step = _step_time(deployment, load)
    rps = starts / step
    return Saturation(batch, kv_batch < max_num_seqs, step, rps, rps * mix.output_tokens)


def saturation_rps(
    deployment: Deployment, mix: WorkloadMix, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
) -> float:
    """Requests per second the replica sustains at ``mix`` (its ``capacity_rps``)."""
    return saturation(deployment, mix, max_num_seqs).rps
