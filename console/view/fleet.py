"""The fleet table's rows: one per GPU, grouped by node and replica, sortable and filterable.

``gpu_rows`` joins the fleet file (which GPUs each node has and which replica uses them), the
router's snapshot (replica state, in flight, load over learned capacity, weights, latency) and
the telemetry feed (per-GPU readings and each node's age). Where GPU telemetry is missing or
stale the utilization shown is the router's own estimate (in flight over batch size), drawn
with a ``~`` and dimmed, so it is never mistaken for a fresh GPU reading. The ``Load/cap``
column is the work asked of the replica over its learned capacity (100%: all the card can
do), what the imbalance factor compares. ``table_rows`` then sorts, filters and renders
cells, which the widget draws by difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from console.view.format import NONE, Cell, Tone, bar, duration, fit, number, pct, sparkline
from router.config.schema import FleetConfig
from router.snapshot import FleetSnapshot, ReplicaSnapshot
from router.telemetry.schema import GpuSample
from router.telemetry.status import NodeFeed, TelemetryStatus


@dataclass(frozen=True, slots=True)
class Column:
    id: str
    label: str
    width: int


COLUMNS: tuple[Column, ...] = (
    Column("replica", "Replica", 12),
    Column("gpu", "GPU", 12),
    Column("state", "State", 10),
    Column("util", "Util", 10),
    Column("hist", "History", 8),
    Column("mem", "Mem", 9),
    Column("run", "Run/Bat", 7),
    Column("load", "Load/cap", 8),
    Column("weight", "Wt s/eff", 9),
    Column("ttft", "TTFT p50/p99", 13),
    Column("data", "Data", 7),
    Column("power", "Power", 9),
    Column("temp", "Temp", 5),
    Column("node", "Node", 10),
)

SORTS: tuple[str, ...] = ("node", "util", "mem", "load", "ttft", "state")
"""Sort orders, cycled by the sort action: grouped by node first, then busiest-first ones
(``load``: the largest share of learned capacity first)."""

_STATE_SYMBOL = {
    "active": ("●", Tone.OK),
    "warming": ("◔", Tone.ACCENT),
    "draining": ("◐", Tone.WARN),
    "drained": ("○", Tone.DIM),
    "ejected": ("✖", Tone.BAD),
    "failing": ("✖", Tone.BAD),
    "offline": ("✖", Tone.BAD),
    "stale": ("⚠", Tone.WARN),
    "mismatch": ("⚠", Tone.BAD),
    "spare": ("·", Tone.DIM),
    "lost": ("✖", Tone.BAD),
}
_STATE_RANK = {
    "ejected": 0,
    "failing": 1,
    "offline": 2,
    "lost": 3,
    "mismatch": 4,
    "stale": 5,
    "draining": 6,
    "drained": 7,
    "warming": 8,
}


@dataclass(frozen=True, slots=True)
class GpuRow:
    """Everything shown about one GPU, before any formatting."""

    key: str
    node: str
    gpu_index: int
    gpu_model: str
    replica: str | None
    state: str
    """Shown state: active, draining, drained, ejected, failing, mismatch, stale, offline,
    lost or spare."""
    util: float
    util_fresh: bool
    """From a fresh GPU reading; False: the router's own estimate."""
    data_age_s: float | None
    """Age of the node's telemetry (None: none received)."""
    telemetry: bool
    """The router has a telemetry feed for this node at all."""
    data_stale: bool
    """The node's telemetry is stale or its agent offline, whatever the replica's state."""
    mem: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: int | None
    in_flight: int
    batch_size: int
    load: float | None
    """Work asked of the replica over its learned capacity (1.0: all it can do); None
    for a GPU no replica uses."""
    batch_pinned: bool
    weight_static: float
    weight: float
    weight_pinned: bool
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    gpu_mismatch: bool = False
    """The node agent names another card than the fleet file (``gpu_model`` is the file's)."""

    @property
    def stale(self) -> bool:
        return self.data_stale or self.state in ("stale", "offline")


def shown_state(
    replica: ReplicaSnapshot | None, feed: NodeFeed | None, failing: bool = False
) -> str:
    """Operator states first (they were chosen); then what the data says; then active.

    ``failing``: in service, but its latest request or health check failed (the router's
    health monitor), so it cannot be counted on to take a request before it is ejected.
    ``mismatch``: in service, but its ``/v1/models`` leaves out the model the fleet file
    declares for it (it gets none of that model's requests). ``warming``: back in service,
    its slot limit still growing (slow start, router/slow_start.py)."""
    if replica is None:
        return "spare"
    if replica.state == "ejected":
        return "ejected"
    if failing and replica.state == "active":
        return "failing"
    if agent_offline(feed):
        return "offline"
    if replica.state != "active":
        return replica.state
    if replica.model_mismatch is not None:
        return "mismatch"
    if replica.stale or (feed is not None and feed.stale):
        return "stale"
    if replica.warm_up_limit is not None:
        return "warming"
    return "active"


def agent_offline(feed: NodeFeed | None) -> bool:
    """The node's agent said offline (its will, or its clean exit). An agent never heard from
    is not: the replicas may well serve (``gpurouter emulate`` runs no agents); its rows show
    the router's state, with their data age ``never``."""
    return feed is not None and not feed.online and feed.session is not None


def gpu_rows(
    fleet: FleetConfig,
    snapshot: FleetSnapshot,
    status: TelemetryStatus,
    samples: Mapping[tuple[str, int], GpuSample],
    *,
    failing: frozenset[str] = frozenset(),
) -> list[GpuRow]:
    """One row per GPU of the fleet file, in file order; ``failing``: the replicas whose
    latest request or health check failed."""
    replicas = {r.id: r for r in snapshot.replicas}
    feeds = {f.node: f for f in status.nodes}
    rows = []
    for node in fleet.nodes:
        owner = {i: rc.id for rc in node.replicas for i in rc.gpus}
        feed = feeds.get(node.name)
        for gpu in node.gpus:
            rid = owner.get(gpu.index)
            rep = replicas.get(rid) if rid is not None else None
            sample = samples.get((node.name, gpu.index))
            down = rid is not None and rid in failing
            rows.append(_row(node.name, gpu.index, gpu.model, rep, feed, sample, down))
    return rows


def _row(
    node: str,
    index: int,
    model: str,
    rep: ReplicaSnapshot | None,
    feed: NodeFeed | None,
    sample: GpuSample | None,
    failing: bool,
) -> GpuRow:
    fresh_feed = feed is not None and not feed.stale and feed.online
    state = shown_state(rep, feed, failing)
    if sample is not None and sample.lost:
        state = "lost"
    if fresh_feed and sample is not None and sample.gpu_util_pct is not None:
        util, util_fresh = sample.gpu_util_pct / 100.0, True
    elif rep is not None:
        util, util_fresh = rep.utilization, rep.utilization_from_telemetry and fresh_feed
    else:
        util, util_fresh = 0.0, False
    mem = None
    if sample is not None and sample.fb_used_mib is not None and sample.fb_total_mib:
        mem = sample.fb_used_mib / sample.fb_total_mib
    return GpuRow(
        key=f"{node}/{index}",
        node=node,
        gpu_index=index,
        gpu_model=model,
        replica=None if rep is None else rep.id,
        state=state,
        util=util,
        util_fresh=util_fresh,
        data_age_s=None if feed is None else feed.age_s,
        telemetry=feed is not None,
        data_stale=feed is not None and (feed.stale or not feed.online),
        mem=mem,
        power_w=None if sample is None else sample.power_w,
        power_limit_w=None if sample is None else sample.power_limit_w,
        temp_c=None if sample is None else sample.temp_c,
        in_flight=0 if rep is None else rep.in_flight,
        batch_size=0 if rep is None else rep.batch_size,
        load=None if rep is None else rep.load,
        batch_pinned=rep is not None and rep.batch_pinned,
        weight_static=0.0 if rep is None else rep.static_weight,
        weight=0.0 if rep is None else rep.weight,
        weight_pinned=rep is not None and rep.weight_pinned,
        ttft_p50_s=None if rep is None else rep.ttft_p50_s,
        ttft_p99_s=None if rep is None else rep.ttft_p99_s,
        gpu_mismatch=rep is not None and rep.gpu_mismatch is not None,
    )


# ---- sorting and filtering -----------------------------------------------------------------


def _sort_key(mode: str) -> Callable[[GpuRow], tuple[object, ...]]:
    keys: dict[str, Callable[[GpuRow], tuple[object, ...]]] = {
        "util": lambda r: (-r.util, r.key),
        "mem": lambda r: (-(r.mem if r.mem is not None else -1.0), r.key),
        "load": lambda r: (-(r.load if r.load is not None else -1.0), r.key),
        "ttft": lambda r: (-(r.ttft_p99_s or 0.0), r.key),
        "state": lambda r: (_STATE_RANK.get(r.state, 9), r.key),
    }
    return keys.get(mode, lambda _: ())


def matches(row: GpuRow, terms: Sequence[str]) -> bool:
    """Every term appears in the row's replica, node, GPU model or state."""
    text = f"{row.replica or ''} {row.node} {row.gpu_model} {row.state}".lower()
    return all(t in text for t in terms)


def select(rows: Iterable[GpuRow], sort: str, query: str) -> list[GpuRow]:
    """Rows that match the filter, in the sort's order (file order when grouped by node)."""
    terms = query.lower().split()
    kept = [r for r in rows if matches(r, terms)]
    if sort != "node":
        kept.sort(key=_sort_key(sort))
    return kept


# ---- cells ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TableRow:
    """One line of the table: a node heading or a GPU, with its cells in column order."""

    key: str
    replica: str | None
    cells: tuple[Cell, ...]
    heading: bool = False


CellCache = dict[str, tuple[GpuRow, tuple[float, ...], bool, tuple[Cell, ...]]]
"""GPU key -> the inputs and the cells made from them, so an unchanged row is not reformatted."""


def table_rows(
    rows: Sequence[GpuRow],
    sort: str,
    history: Callable[[str], Iterable[float]],
    feeds: Mapping[str, NodeFeed],
    cache: CellCache | None = None,
) -> list[TableRow]:
    """Cells for every row; grouped by node (with a heading per node) when sorted by node."""
    memo: CellCache = {} if cache is None else cache
    out: list[TableRow] = []
    last_node, last_replica = None, None
    for row in rows:
        grouped = sort == "node"
        if grouped and row.node != last_node:
            members = [r for r in rows if r.node == row.node]
            out.append(_heading(row.node, members, feeds.get(row.node)))
            last_replica = None
        # In a group, a replica's id is written on its first GPU only: tensor-parallel
        # replicas read as one block.
        repeat = grouped and row.replica is not None and row.replica == last_replica
        points = tuple(history(row.key))[-8:]
        hit = memo.get(row.key)
        if hit is not None and hit[0] == row and hit[1] == points and hit[2] == repeat:
            cells = hit[3]
        else:
            cells = gpu_cells(row, points, repeat)
            memo[row.key] = (row, points, repeat, cells)
        out.append(TableRow(row.key, row.replica, cells))
        last_node, last_replica = row.node, row.replica
    return out


def _heading(node: str, members: Sequence[GpuRow], feed: NodeFeed | None) -> TableRow:
    blank: Cell = ("", Tone.NORMAL)
    replicas = len({r.replica for r in members if r.replica})
    if feed is None:
        status: Cell = ("no feed", Tone.DIM)
    elif feed.session is None:
        status = ("◌ no agent", Tone.WARN)
    elif not feed.online:
        status = ("✖ offline", Tone.BAD)
    elif feed.stale:
        status = ("⚠ stale", Tone.WARN)
    else:
        status = ("● online", Tone.OK)
    cells: dict[str, Cell] = {
        "replica": (fit(f"▾ {node}", 12), Tone.ACCENT),
        "gpu": (f"{len(members)} GPU {replicas} rep", Tone.DIM),
        "state": status,
        "data": _age_cell(feed is not None, feed.age_s if feed else None, feed),
    }
    return TableRow(f"node:{node}", None, tuple(cells.get(c.id, blank) for c in COLUMNS), True)


def _age_cell(telemetry: bool, age: float | None, feed: NodeFeed | None) -> Cell:
    if not telemetry:
        return ("router", Tone.DIM)
    if age is None:
        return ("never", Tone.WARN)
    if feed is not None and (feed.stale or not feed.online):
        return (f"⚠{duration(age)}", Tone.WARN)
    return (duration(age), Tone.NORMAL)


def state_cell(state: str) -> Cell:
    symbol, tone = _STATE_SYMBOL.get(state, ("?", Tone.NORMAL))
    return (f"{symbol} {state}", tone)


def gpu_cells(row: GpuRow, points: Iterable[float], repeat: bool = False) -> tuple[Cell, ...]:
    """The row's cells in column order."""
    util_tone = Tone.NORMAL if row.util_fresh else Tone.DIM
    # "~" marks the router's estimate where no fresh GPU reading exists.
    util_text = f"{bar(row.util, 5)}{'' if row.util_fresh else '~'}{pct(row.util):>4}"
    if row.replica is None:
        replica: Cell = (NONE, Tone.DIM)
    else:
        replica = ("  ┆" if repeat else fit(row.replica, 12), Tone.NORMAL)
    pin_w = "*" if row.weight_pinned else ""
    pin_b = "*" if row.batch_pinned else ""
    cells: dict[str, Cell] = {
        "replica": replica,
        "gpu": (
            fit(f"{row.gpu_index} {row.gpu_model}", 12),
            Tone.WARN if row.gpu_mismatch else Tone.NORMAL,
        ),
        "state": state_cell(row.state),
        "util": (util_text, util_tone),
        "hist": (sparkline(points, 8), util_tone),
        "mem": (NONE, Tone.DIM)
        if row.mem is None
        else (f"{bar(row.mem, 4)}{pct(row.mem):>5}", Tone.NORMAL),
        "run": (f"{row.in_flight}/{row.batch_size}{pin_b}", _run_tone(row)),
        "load": (NONE, Tone.DIM)
        if row.load is None
        else (pct(row.load), Tone.WARN if row.load >= 1.0 else Tone.NORMAL),
        "weight": (f"{number(row.weight_static)}/{number(row.weight)}{pin_w}", Tone.NORMAL)
        if row.replica
        else (NONE, Tone.DIM),
        "ttft": (f"{duration(row.ttft_p50_s)}/{duration(row.ttft_p99_s)}", Tone.NORMAL),
        "data": _row_age(row),
        "power": _power(row),
        "temp": (NONE, Tone.DIM)
        if row.temp_c is None
        else (f"{row.temp_c}°C", _temp_tone(row.temp_c)),
        "node": (fit(row.node, 10), Tone.DIM),
    }
    if row.stale:
        # Old readings stay visible for context but are dimmed: never shown as fresh.
        for cid in ("mem", "power", "temp"):
            cells[cid] = (cells[cid][0], Tone.DIM)
    return tuple(cells[c.id] for c in COLUMNS)


def _row_age(row: GpuRow) -> Cell:
    if not row.telemetry:
        return ("router", Tone.DIM)
    if row.data_age_s is None:
        return ("never", Tone.WARN)
    if row.stale:
        return (f"⚠{duration(row.data_age_s)}", Tone.WARN)
    return (duration(row.data_age_s), Tone.NORMAL)


def _power(row: GpuRow) -> Cell:
    if row.power_w is None:
        return (NONE, Tone.DIM)
    if row.power_limit_w:
        return (f"{row.power_w:.0f}/{row.power_limit_w:.0f}W", Tone.NORMAL)
    return (f"{row.power_w:.0f}W", Tone.NORMAL)


def _temp_tone(celsius: int) -> Tone:
    if celsius >= 85:
        return Tone.BAD
    if celsius >= 75:
        return Tone.WARN
    return Tone.NORMAL


def _run_tone(row: GpuRow) -> Tone:
    if row.batch_size and row.in_flight >= row.batch_size:
        return Tone.WARN
    return Tone.NORMAL
