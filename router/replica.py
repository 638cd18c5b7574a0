"""A replica's live state inside the router: what it runs, what it can take, how fast it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from router.config.schema import ReplicaConfig
from router.ewma import Ewma, PeakEwma
from router.kv_budget import KvBook
from router.request import Request


class ReplicaState(StrEnum):
    ACTIVE = "active"
    """Takes new work."""
    DRAINING = "draining"
    """Takes no new work; finishing what it has."""
    DRAINED = "drained"
    """Takes no new work and runs nothing."""
    EJECTED = "ejected"
    """Taken out by health checks or an operator; takes no new work."""


@dataclass(slots=True)
class Telemetry:
    """The latest GPU reading for a replica, stamped with the router's clock at arrival."""

    utilization: float
    """GPU utilization, 0..1 (the mean over the replica's GPUs)."""
    received_at: float
    memory_used_fraction: float | None = None
    kv_usage: float | None = None
    """Engine KV-cache usage, 0..1, from the replica's own metrics."""
    gpu_name: str | None = None
    """The name NVML gives the replica's GPUs (``NVIDIA H200``); None when a GPU gave none or
    they differ. The capacity model checks it against the fleet file (router/capacity.py)."""


@dataclass(slots=True)
class EngineLoad:
    """The replica's engine's own view of its load, from its ``/metrics``, normalised over
    engines (vLLM, SGLang, TGI) and stamped with the router's clock when read."""

    engine: str
    """Which engine's names were found: ``vllm``, ``vllm-deprecated``, ``sglang`` or ``tgi``."""
    received_at: float
    waiting: int | None = None
    """Requests queued inside the engine."""
    running: int | None = None
    """Requests in the engine's running batch."""
    kv_usage: float | None = None
    """KV-cache usage, 0..1 (None: the engine does not say)."""
    kv_capacity_tokens: int | None = None
    """Tokens the engine's KV cache holds, as the engine itself publishes it (vLLM's
    ``vllm:cache_config_info``: blocks times block size); None when it does not say."""
    preemptions_total: int | None = None
    """The engine's cumulative count of preempted sequences (a counter: compare readings)."""


@dataclass(slots=True, eq=False)
class Replica:
    """Mutable runtime state; changed only by the router core, which tells the strategy."""

    index: int
    config: ReplicaConfig
    weight: float
    """Effective weight: the static weight, an operator's setting, or the adaptive tuner's."""
    batch_size: int
    """Effective batch size (most requests in flight at once)."""
    state: ReplicaState = ReplicaState.ACTIVE
    state_reason: str = ""
    """Why it is in its state, as whoever moved it there said (``""``: no reason given)."""
    weight_pinned: bool = False
    """An operator set the weight; the tuner leaves it alone until released."""
    batch_pinned: bool = False
    running: dict[str, Request] = field(default_factory=dict)
    """This router's own requests running there."""
    own_cost: float = 0.0
    """Estimated cost of this router's own requests running there."""
    shared_in_flight: int = 0
    """The other worker processes' requests running there, read from the load table they
    share (router/workers/shared_load.py; 0 with one process): exact, not estimated."""
    shared_cost: float = 0.0
    """The same workers' outstanding cost there."""
    peers: int = 0
    """Other routers whose load reports count now (router/peer_load.py; 0 with one router)."""
    peer_offset: int = 0
    """Sum over those peers of (reported in flight - ours when the report came): their
    in flight now is estimated as that plus ``peers`` times ours (router/peer_load.py)."""
    peer_cost_offset: float = 0.0
    """The same for outstanding cost."""
    latency: PeakEwma = field(default_factory=PeakEwma)
    """Seconds per unit of cost, over completed requests."""
    telemetry: Telemetry | None = None
    engine: EngineLoad | None = None
    """The engine's own queue and KV-cache usage, from its /metrics (None: never read)."""
    node_online: bool | None = None
    """What the node's agent last said (None: no agent heard from)."""
    completed: int = 0
    failed: int = 0
    speed: float = 1.0
    """Learned service rate in cost units per second (router/capacity.py), or the operator's
    pinned weight turned into one: what every load-aware strategy divides load by."""
    kv_limit: int | None = None
    """Tokens the replica's KV cache holds for certain: the engine's own figure, else the
    fleet file's; None: not known for certain (a request is then never refused for size)."""
    kv_tokens: int | None = None
    """The best estimate of the same: ``kv_limit``, else the performance model's prior."""
    slowdown_recent: Ewma = field(default_factory=lambda: Ewma(tau=5.0))
    """Each request's measured duration over what ``expected_seconds`` predicted when it was
    sent, averaged over the last few seconds: one request that shared the engine with many
    later arrivals is not a slowdown, a few seconds of them are."""
    slowdown: PeakEwma = field(default_factory=PeakEwma)
    """Peak EWMA of ``slowdown_recent``: up at once, down with a 10 s time constant."""
    slowdown_norm: Ewma = field(default_factory=Ewma)
    """The same ratio's slow plain average: what is usual for this replica (requests share
    the engine with later arrivals, so the ratio is not 1 even when the rate is right)."""
    kv: KvBook = field(default_factory=KvBook)
    """What this router's requests there book of the KV cache, scaled by the engine's own
    usage (router/kv_budget.py)."""
    kv_guard: bool = True
    """Whether a KV cache booked full closes its slots: off under the fixed splits, which
    stay the references they are (``Strategy.books_kv``)."""
    warm_up_limit: int | None = None
    """While it warms up after its return to service, the most requests it may run
    (router/slow_start.py); None: only the batch size limits it."""
    gpu_mismatch: str | None = None
    """``NVML reports X, fleet file says Y`` when the node agent names another card than the
    fleet file declares: the capacity model then runs on the card NVML names (set by
    router/capacity.py)."""
    served_models: tuple[str, ...] | None = None
    """The model names the replica's own ``GET /v1/models`` listed last
    (router/http/served_models.py); None: it has not answered yet."""

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def in_flight(self) -> int:
        """Requests running there: this router's own, its sibling workers' (read) and its
        peers' (estimated). What every load-aware strategy and the batch-size limit count."""
        return len(self.running) + self.shared_in_flight + self.peer_in_flight

    @property
    def own_in_flight(self) -> int:
        """This router's own requests running there."""
        return len(self.running)

    @property
    def peer_in_flight(self) -> int:
        """The other routers' requests running there, estimated (router/peer_load.py)."""
        if not self.peers:
            return 0
        return max(0, self.peers * len(self.running) + self.peer_offset)

    @property
    def peer_cost(self) -> float:
        """The other routers' outstanding cost there, estimated the same way."""
        if not self.peers:
            return 0.0
        return max(0.0, self.peers * self.own_cost + self.peer_cost_offset)

    @property
    def outstanding_cost(self) -> float:
        """Estimated work running there: this router's own, its sibling workers' and its
        peers'."""
        return self.own_cost + self.shared_cost + self.peer_cost

    def expected_seconds(self, cost: float) -> float:
        """Seconds to finish the work already here plus ``cost`` more, at the learned rate."""
        return (self.outstanding_cost + cost) / self.speed

    def observe_slowdown(self, ratio: float, now: float) -> None:
        """A request took ``ratio`` times what ``expected_seconds`` predicted."""
        self.slowdown_recent.observe(ratio, now)
        self.slowdown_norm.observe(ratio, now)
        recent = self.slowdown_recent.value
        if recent is not None:
            self.slowdown.observe(recent, now)

    def slowdown_factor(self) -> float:
        """How much slower than usual the replica has been lately: the peak EWMA of measured
        over expected durations, over its plain long-run average (1.0 before samples)."""
        peak, usual = self.slowdown.value, self.slowdown_norm.value
        if peak is None or usual is None or usual <= 0:
            return 1.0
        return max(1.0, peak / usual)

    @property
    def has_slot(self) -> bool:
        """Active with room for one more request, the peers' requests counted (a replica's
        batch size is shared by every router in front of it).

        Up to one request per peer past the batch size is allowed: a slot a peer's request
        freed is seen only at that peer's next report, and without the slack it would stay
        empty until then whenever that peer has nothing waiting (see router/peer_load.py).
        Sibling workers' requests get no slack: the load table is read before each pick.
        Two workers that pick at the same instant can both take the last slot, so with
        ``N`` workers a replica holds at most ``batch_size + N - 1`` (router/workers).
        A replica warming up after its return to service has fewer slots for now, and one
        whose KV cache is booked full has none (router/kv_budget.py), except under a fixed
        split."""
        limit = self.batch_size
        if self.warm_up_limit is not None:
            limit = min(limit, self.warm_up_limit)
        return (
            self.state is ReplicaState.ACTIVE
            and self.in_flight < limit + self.peers
            and not (self.kv_guard and self.kv.full(self.kv_limit, self.in_flight))
        )

    def utilization(self, now: float, stale_after_s: float) -> tuple[float, bool]:
        """Busy fraction 0..1 and whether it came from fresh GPU telemetry.

        Stale or missing telemetry falls back to the router's own view (in flight over batch
        size) rather than trusting an old reading.
        """
        t = self.telemetry
        if t is not None and now - t.received_at <= stale_after_s:
            return t.utilization, True
        return min(1.0, self.in_flight / self.batch_size), False

    @property
    def models(self) -> tuple[str, ...]:
        """The models requests may ask of it: what it said it serves, else what the fleet
        file declares."""
        served = self.served_models
        return (self.config.model,) if served is None else served

    @property
    def version(self) -> str:
        """The model version it runs: the fleet file's ``version`` while the replica lists it
        (or has not answered yet), else the first name its ``/v1/models`` lists (an engine
        lists its version first, then the stable names it is also served under), else the
        fleet file's ``model``."""
        declared = self.config.version
        served = self.served_models
        if served is None or not served:
            return declared or self.config.model
        return declared if declared in served else served[0]

    def serves(self, model: str) -> bool:
        """Whether requests for ``model`` may go here: the one rule of model-aware routing.

        A replica that has not answered ``/v1/models`` yet is judged by the fleet file (the
        only knowledge there is; the server asks every replica before it opens its doors); one
        that answered is judged by what it said, so a replica serving another model than the
        fleet file declares gets none of the declared model's requests, and takes requests
        for what it does serve (two versions side by side, traffic moved by name)."""
        served = self.served_models
        return model == self.config.model if served is None else model in served

    @property
    def model_mismatch(self) -> str | None:
        """``serves X, fleet file says Y`` when what the replica said it serves leaves out the
        model the fleet file declares for it; None when it serves it or has not said."""
        served = self.served_models
        if served is None or self.config.model in served:
            return None
        return f"serves {', '.join(served) or 'nothing'}, fleet file says {self.config.model}"

    def fits(self, request: Request) -> bool:
        """Whether the replica could ever serve the request (its model, context and KV budget)."""
        if request.model is not None and not self.serves(request.model):
            return False
        if request.version is not None and self.version != request.version:
            return False  # a traffic split sent it to the other version (router/rollout/split)
        need = request.total_tokens
        limit = self.config.max_context_tokens
        kv = self.kv_limit
        return (limit is None or need <= limit) and (kv is None or need <= kv)

    def can_take(self, request: Request) -> bool:
        """Eligible for this request now: a free slot, it fits, and it has not failed it."""
        return self.has_slot and self.fits(request) and self.index not in request.avoid
