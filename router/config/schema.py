"""Typed, immutable fleet configuration.

The YAML loader (``router.config.loader``) builds these objects and nothing else does, so the
rest of gpurouter can trust every value here: weights are positive, batch sizes at least one,
replica ids unique. The string under each field is its documentation; the configuration
reference in docs/configuration.md is written from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any


def _frozen_params() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """One GPU of a node."""

    index: int
    """NVML index of the GPU on its node (0, 1, ...)."""
    model: str
    """GPU model name as in the profiles, for example ``A100-80GB`` or ``V100-32GB``. Checked
    against the name NVML gives the card once the node's agent reports: a card the profiles
    know under that name, other than this one, is modelled as what NVML names and flagged."""
    memory_gib: float
    """Memory of the card in GiB."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """One data-parallel replica of the served model."""

    id: str
    """Unique name of the replica across the fleet."""
    node: str
    """Name of the node the replica runs on (filled from its node)."""
    endpoint: str
    """Base URL of the replica's OpenAI-compatible server, for example ``http://10.0.0.5:8000``."""
    model: str
    """Model name the replica serves (defaults to the fleet's ``model``): a declaration,
    checked against the replica's own ``/v1/models``, which decides routing once known."""
    gpus: tuple[int, ...]
    """Indexes of the node's GPUs the replica uses; more than one means tensor parallelism."""
    gpu_model: str
    """GPU model of those GPUs (derived; they must all be of one model)."""
    weight: float = 1.0
    """Static weight, relative to the other replicas; from 0.000001 to 1000000."""
    batch_size: int = 32
    """Most requests the router sends the replica at once; from 1 to 65536."""
    tier: str = "standard"
    """Tier name used by the tiered strategy, for example ``strong`` or ``standard``."""
    tags: tuple[str, ...] = ()
    """Free-form labels."""
    max_context_tokens: int | None = None
    """Longest prompt + output the replica accepts (its engine's max model length), if known."""
    kv_capacity_tokens: int | None = None
    """Tokens the replica's KV cache holds, if known; used by the capacity-aware strategy."""
    version: str | None = None
    """The model version it runs (a served model name, for example ``llama-v2``), when it is
    not ``model`` itself: a declaration, like ``model``; once the replica answers
    ``/v1/models`` the first name it lists is its version (docs/rollouts.md)."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A GPU node: its GPUs and the replicas it runs."""

    name: str
    """Unique name of the node; the telemetry agent on it uses the same name."""
    gpus: tuple[GpuConfig, ...]
    """The node's GPUs."""
    replicas: tuple[ReplicaConfig, ...]
    """The replicas the node runs."""


@dataclass(frozen=True, slots=True)
class StrategyConfig:
    """Which routing strategy to start with, and its parameters."""

    name: str = "shortest-expected-delay"
    """A strategy's registry name; ``gpurouter strategies`` lists them. The default ranks
    replicas by the seconds they would take to finish their work plus the request's, at their
    learned capacity: the best of the strategies on fleets nobody tuned
    (docs/benchmarks.md)."""
    params: Mapping[str, Any] = field(default_factory=_frozen_params)
    """Parameters of that strategy (each strategy documents its own)."""


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """The admission queue in front of the fleet."""

    size: int = 1024
    """Most requests waiting at once; beyond it requests are rejected (HTTP 429)."""
    default_deadline_s: float = 60.0
    """How long a request may wait in the queue when it names no deadline of its own."""
    retry_after_max_s: float = 30.0
    """Longest ``Retry-After`` a refused client is told: the queue's drain time at the
    current completion rate, which a nearly idle fleet would put at many minutes."""


@dataclass(frozen=True, slots=True)
class RetryConfig:
    """Retries on another replica, only before anything was sent to the client."""

    attempts: int = 3
    """Most attempts per request, the first included; must be >= 1."""
    backoff_s: float = 0.05
    """Wait before the first retry; doubled each time."""
    backoff_max_s: float = 1.0
    """Longest wait between retries."""


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """Upstream timeouts."""

    connect_s: float = 2.0
    """Opening a connection to a replica."""
    first_byte_s: float = 30.0
    """From sending a request to its first response byte."""
    total_s: float = 600.0
    """A whole request."""


@dataclass(frozen=True, slots=True)
class CostConfig:
    """How a request's cost is estimated before it runs."""

    prompt_factor: float = 0.5
    """Cost of one prompt token relative to one generated token."""
    default_max_tokens: int = 256
    """Generated tokens assumed for a request that names no ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """Weights and batch sizes retuned from live signals."""

    weights: bool = False
    """Retune weights (what the fixed splits use) from each replica's learned capacity and
    response time."""
    batch_sizes: bool = False
    """Raise or lower batch sizes on overload signals: the engine's own queue, preemptions,
    time to first token over ``ttft_target_s``."""
    interval_s: float = 5.0
    """How often the tuners run."""
    weight_damping: float = 0.3
    """Fraction of the way to the measured weight taken per interval (0 < d <= 1)."""
    weight_bounds: tuple[float, float] = (0.0625, 16.0)
    """Effective weight stays within these multiples of the static weight (the default
    allows a 256x spread between cards)."""
    ttft_target_s: float = 2.0
    """Time to first token, from sending to the replica (the router's queue not counted),
    above which the replica counts as overloaded (90th percentile over an interval). Streamed
    answers only: a non-streamed answer's first byte is the whole answer."""
    decrease: float = 0.75
    """Factor a batch size is multiplied by on overload (multiplicative decrease)."""
    hysteresis: int = 2
    """Consecutive intervals a signal must hold before the batch size moves (at least 2:
    never on a single reading)."""
    batch_bounds: tuple[int, int] = (1, 512)
    """Smallest and largest batch size the tuner sets (the largest at most 65536)."""
    grow_past_batch_size: bool = False
    """Let the tuner grow a replica's batch size past the fleet file's, up to the largest of
    ``batch_bounds``: by one slot at a time until the engine shows it runs more, then by
    eighths. Off by default: the fleet file's size is usually the engine's own limit
    (vLLM's ``max_num_seqs``), which vLLM does not publish, and each probe past it queues a
    request inside the engine until two readings of its metrics show the limit."""


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """Active health checks and passive outlier ejection of replicas."""

    check_interval_s: float = 5.0
    """How often each replica's health endpoint is probed; 0 turns active checks off."""
    check_path: str = "/health"
    """Path of the replica's health endpoint (vLLM, SGLang and TGI all serve ``/health``)."""
    check_timeout_s: float = 2.0
    """A probe that takes longer has failed (a silent replica's generation probe may be given
    longer: see ``stream_idle_max_s``)."""
    eject_after_failures: int = 5
    """Consecutive failed requests or probes that eject a replica; 0 turns ejection off."""
    eject_base_s: float = 10.0
    """How long the first ejection lasts at most; each ejection in a row doubles it. With
    active checks on, an ejected replica is also probed (a one-token generation) at every
    check, and is back in service as soon as one succeeds."""
    eject_max_s: float = 300.0
    """Longest ejection; after it a probe decides whether the replica comes back."""
    max_ejection_percent: float = 50.0
    """Most of the replicas in service (active, or ejected by health checking) that health
    checking keeps out at once, in percent, rounded down (with 50: one of 2 or 3, none of 1):
    below 100 at least one replica always stays in rotation. A replica judged unhealthy
    beyond it stays in service, counted unhealthy. Envoy's ``max_ejection_percent``."""
    panic_threshold_percent: float = 50.0
    """Panic mode: when fewer than this share of the replicas in service are healthy (neither
    ejected nor judged unhealthy), every one of them is routed to, the ejected readmitted,
    until enough are healthy again; the log, the audit trail (a ``panic`` event), the admin
    state (``panic``), /metrics (``gpurouter_panic``) and the console say so. 0 turns panic
    mode off. Envoy's healthy panic threshold."""
    stream_idle_max_s: float = 2.5
    """Ceiling of each replica's idle limit: a stream that relays nothing for longer than the
    limit, or a replica that holds work and sends nothing for that long, gets the replica
    probed at once with a one-token generation. Silence alone ends nothing (a slow card's
    full-budget prefill step silences every stream on it for seconds): only a probe that
    neither generates nor hears from the replica within its verdict window (two of the
    replica's longest plausible steps, seen in its chunk gaps or modelled for its card and
    model, at least ``check_timeout_s``) ejects it, ends its streams with an error event and
    re-runs elsewhere the requests on it that have sent nothing to their client yet. The
    limit is learned from the replica's gaps between chunks (3 times the longest gap of the
    last minutes, a peak that halves every 60 s; at least 1.5 s); a replica with none
    observed yet gets this ceiling. A frozen replica is out within this plus its verdict
    window. 0 turns the watch off."""
    engine_metrics_interval_s: float = 2.0
    """How often each replica's own ``/metrics`` (queue, KV-cache usage) is read; 0: never."""
    models_interval_s: float = 10.0
    """How often each replica's ``/v1/models`` is read to learn the models it serves (also at
    start, and when it is readmitted or undrained); 0: never, the fleet file's ``model`` is
    trusted."""


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How the router admits, routes and retries requests."""

    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    """The starting strategy."""
    queue: QueueConfig = field(default_factory=QueueConfig)
    """The admission queue."""
    retries: RetryConfig = field(default_factory=RetryConfig)
    """Retry policy."""
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    """Upstream timeouts."""
    cost: CostConfig = field(default_factory=CostConfig)
    """Request cost estimate."""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Adaptive weights and batch sizes."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """Health checks and outlier ejection."""
    decision_log_size: int = 256
    """How many recent routing decisions are kept, with their explanations."""
    slow_start_s: float = 30.0
    """Seconds over which a replica back in service (undrained, readmitted) grows from one
    request in flight to its batch size, so that it is not handed every new request at once;
    0 turns slow start off."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """The MQTT broker that carries telemetry and control."""

    url: str = "embedded"
    """``embedded`` (a broker inside gpurouter, on loopback) or ``mqtt://host:port`` / ``mqtts://``."""
    username: str | None = None
    """Broker user name."""
    password_env: str | None = None
    """Name of the environment variable that holds the broker password (never the password)."""
    sample_period_s: float = 1.0
    """Telemetry sample period the agents use."""
    ca_file: str | None = None
    """CA bundle that signs the broker's certificate (``mqtts://``); the system's by default."""
    cert_file: str | None = None
    """Client certificate, for brokers that authenticate clients by TLS."""
    key_file: str | None = None
    """Private key of ``cert_file``."""
    keepalive_s: int = 30
    """MQTT keep-alive: how soon the broker notices a silent client and sends its will."""
    max_payload_bytes: int = 65536
    """Telemetry payloads larger than this are dropped and counted, unread."""


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Operators' commands over MQTT: who may send them, and what each router remembers."""

    secret_env: str | None = None
    """Name of the environment variable that holds the secret control messages are signed
    with (HMAC-SHA256, at least 16 characters; never the secret itself). Unset, the variable
    ``GPUROUTER_CONTROL_SECRET`` is read; with neither, control messages are not
    authenticated and the router says so at start."""
    max_clock_skew_s: float = 60.0
    """A command's version is its publisher's wall clock in milliseconds; one further ahead of
    the router's clock than this is refused and counted, so that no message (a forged one,
    or one from a clock set wrong) can hold a slot against the operator's later commands."""
    state_file: str | None = None
    """File where the router keeps the operator's last applied desired state, so that after a
    broker that lost its retained messages it starts from the operator's word, not the fleet
    file's. Relative to the fleet file; by default
    ``$XDG_STATE_HOME/gpurouter/control/<cluster>.json`` (``~/.local/state`` when unset)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The router's HTTP listeners: the OpenAI-compatible front door and the admin API."""

    listen: str = "127.0.0.1:8000"
    """``host:port`` of the front door (``/v1/...``, ``/health``, ``/ready``, ``/metrics``)."""
    admin_listen: str = "127.0.0.1:8001"
    """``host:port`` of the admin API; a non-loopback address needs ``admin_token_env``."""
    admin_token_env: str | None = None
    """Name of the environment variable that holds the admin bearer token (never the token);
    the router refuses to start (exit 2) when that variable is not set or is empty."""
    max_body_bytes: int = 4194304
    """Largest request body accepted; larger ones get HTTP 413."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, how long in-flight requests may take to finish before the router exits."""
    upstream_connections: int | None = None
    """Most open connections to all replicas together; by default the sum of batch sizes."""
    keepalive_s: float = 4.0
    """How long an idle upstream connection is kept for reuse. Shorter than the replicas'
    own idle timeout (vLLM and SGLang serve with uvicorn, which closes after 5 s): a
    connection the replica is closing at the moment of reuse fails the request."""
    client_keepalive_s: int = 75
    """How long the front door keeps an idle client connection open. Longer than clients'
    own pools keep one (aiohttp 15 s, httpx 5 s), so that a client never sends a request
    on a connection the router is closing."""
    max_connections: int = 4096
    """Most client connections open at once per listener, lowered to what the open-file
    limit leaves beside the upstream pool. At the limit a new connection replaces the one
    idle longest; with none idle it gets 503. 0: only the file limit."""
    max_request_line_bytes: int = 8192
    """Longest request target (path and query) accepted; longer ones get 414. 0: no limit."""
    max_header_bytes: int = 65536
    """Largest request head (request line and headers) accepted; larger ones get 431."""
    max_headers: int = 100
    """Most header fields in one request; more get 431. 0: no limit."""
    header_timeout_s: float = 10.0
    """How long a request's head may take to arrive, from its first byte (or the connection
    opening); then 408, or a silent close for a connection that sent nothing. 0: no limit."""
    body_timeout_s: float = 30.0
    """Longest pause between two parts of a request body; then 408. 0: no limit."""


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """The terminal console's defaults."""

    theme: str = "dark"
    """Theme at start: ``dark``, ``light`` or ``high-contrast`` (switchable at run time)."""
    refresh_s: float = 1.0
    """How often the dashboard redraws from a fresh snapshot."""
    keys: Mapping[str, str] = field(default_factory=_frozen_params)
    """Key rebinding: action id -> key (Textual key names, e.g. ``ctrl+s`` or ``f5``)."""


@dataclass(frozen=True, slots=True)
class CommandUpdaterConfig:
    """Update a replica by running a command on the router's machine, without a shell."""

    run: str
    """The command line, for example ``systemctl restart vllm@{replica}``: split into
    arguments as a POSIX shell would (quotes group words), then ``{replica}``, ``{node}``,
    ``{url}`` and ``{version}`` are replaced inside each argument, and it runs without a shell,
    so no value can inject one; write ``sh -c '...'`` to have one."""
    timeout_s: float = 600.0
    """How long the command may run; then it is killed and the update has failed."""


@dataclass(frozen=True, slots=True)
class HttpUpdaterConfig:
    """Update a replica with one HTTP request (an orchestrator's API, a node agent)."""

    url: str
    """URL template, for example ``http://{node}:9000/restart/{replica}``; the placeholders of
    ``command.run``, each percent-encoded but ``{url}`` (the replica's own base URL)."""
    method: str = "POST"
    """HTTP method."""
    body: str | None = None
    """Body template, sent as JSON (``{"version": "{version}"}``); None sends no body."""
    expect_status: int = 200
    """The status that means the update was accepted; any other is a failure."""
    timeout_s: float = 60.0
    """How long the request may take."""


@dataclass(frozen=True, slots=True)
class UpdaterConfig:
    """How a replica is moved to another version: exactly one of ``command`` and ``http``."""

    command: CommandUpdaterConfig | None = None
    """Run a command per replica."""
    http: HttpUpdaterConfig | None = None
    """Send an HTTP request per replica."""


@dataclass(frozen=True, slots=True)
class CanaryConfig:
    """A canary's traffic split and its automatic rollback (docs/rollouts.md#canary)."""

    steps: tuple[float, ...] = (5.0, 25.0, 50.0, 100.0)
    """Percentages of the stable name's requests sent to the new version, in order, each
    above 0, at most 100 and above the one before; the last one held ``dwell_s`` promotes."""
    dwell_s: float = 60.0
    """How long each step is held before the next (when the canary steps on its own)."""
    window_s: float = 60.0
    """The sliding window the new and old versions' error rates and p99 TTFT are taken over."""
    min_requests: int = 20
    """Requests each version must have finished in the window before they are compared."""
    max_error_rate_increase: float = 0.05
    """Roll back when the new version's error rate exceeds the old one's by more than this
    (0.05: five percentage points)."""
    max_ttft_ratio: float = 2.0
    """Roll back when the new version's p99 TTFT exceeds this many times the old one's."""
    check_interval_s: float = 1.0
    """How often the two versions are compared."""


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """Model rollouts in rolling waves (docs/rollouts.md): the defaults a rollout starts with."""

    floor: float = 0.75
    """Share of the fleet's learned capacity that must stay in service during a rollout,
    above 0 and below 1; a plan that cannot keep it is refused."""
    order: str = "weakest-first"
    """Which replicas go first: ``weakest-first`` (a bad version meets little traffic first)
    or ``strongest-first``; a rollout may also name its own order."""
    drain_timeout_s: float = 300.0
    """How long a wave waits for its replicas' in-flight requests to finish."""
    on_drain_timeout: str = "wait"
    """Then: ``wait`` (on, until they finish) or ``preempt`` (requests not yet answering are
    re-run elsewhere; streams under way end with an error event)."""
    ready_timeout_s: float = 900.0
    """How long an updated replica may take to serve the new version (its ``/v1/models``
    names it and a one-token generation succeeds); then the rollout stops."""
    check_interval_s: float = 1.0
    """How often an updated replica is asked whether it serves the new version."""
    load_estimate_s: float = 60.0
    """How long an update keeps a replica out of service (restart and model load), as the
    simulator and the rollout's prediction count it; the emulator updater's own load time
    is used instead where there is one."""
    updater: UpdaterConfig | None = None
    """How each replica is updated; without one, a rollout must name its own."""
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    """Canary defaults: the steps, the dwell and the rollback judge's thresholds."""
    green: str | None = None
    """Blue-green: the version of the standby (green) set, the replicas whose ``version`` is
    this; they take none of their model's requests until ``switch`` (docs/rollouts.md)."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """A whole fleet file."""

    nodes: tuple[NodeConfig, ...]
    """The fleet's nodes."""
    cluster: str = "default"
    """Cluster name shown in the console and used in MQTT topics."""
    model: str | None = None
    """Default served model for replicas that name none."""
    router: RouterConfig = field(default_factory=RouterConfig)
    """Router settings."""
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    """Broker settings."""
    control: ControlConfig = field(default_factory=ControlConfig)
    """Control over MQTT."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """HTTP listeners."""
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    """Console defaults."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Model rollouts."""
    profiles: tuple[str, ...] = ()
    """Paths of extra GPU/model profile YAML files, relative to the fleet file; they add to or
    override the built-in profiles in router/perf/."""
    source: Path | None = None
    """The file this configuration was read from, if any."""

    @property
    def replicas(self) -> tuple[ReplicaConfig, ...]:
        """Every replica of every node, in file order."""
        return tuple(r for n in self.nodes for r in n.replicas)

    @property
    def gpu_count(self) -> int:
        """Number of GPUs over all nodes."""
        return sum(len(n.gpus) for n in self.nodes)
