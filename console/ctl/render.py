"""What ``gpurouter ctl`` prints: the status table, one line per event and per decision.

Everything here takes the admin API's JSON (plain dicts) and returns text or rich
renderables; nothing does I/O but :func:`print_status`, which writes to the stream it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from console.view.capacity import booked, kv, learned
from console.view.format import NONE, duration, number, pct, rate

__all__ = [
    "capacity_cell",
    "decision_line",
    "event_line",
    "kv_cell",
    "print_status",
    "status_view",
    "telemetry_lines",
]

_STATE_STYLE = {"active": "green", "draining": "yellow", "drained": "dim", "ejected": "red"}
_BAND_STYLE = {"excellent": "green", "good": "green", "watch": "yellow", "action": "bold red"}
PIN = "*"
"""Marks a weight or batch size the operator pinned (``ctl weight``/``ctl batch``)."""
LEGEND = (
    "util from: tel = GPU telemetry, router = router accounting (no telemetry),",
    f"           stale = telemetry too old (router accounting shown); {PIN} = pinned",
    "capacity: learned req/s with its source (prior, measured, operator) and age;",
    "          load = work asked of it over that capacity (100% = all it can do)",
)

State = Mapping[str, Any]

_SELF_DESCRIBED = frozenset({"state", "tune", "panic", "rollout"})
"""Event kinds whose message says all their arguments do (a rollout's start carries its whole
plan, said in a line by the message)."""


def print_status(state: State, out: TextIO) -> None:
    """Write the status view to ``out`` (colour only where ``out`` is a terminal)."""
    Console(file=out, highlight=False, soft_wrap=False).print(status_view(state))


def status_view(state: State) -> RenderableType:
    """The fleet's header lines (after a panic line, in panic mode), a table of replicas, one of
    their learned capacity, and the health and telemetry lines."""
    parts: list[RenderableType] = [*_panic_lines(state), *_header(state), _replica_table(state)]
    if state["replicas"] and "capacity_rps" in state["replicas"][0]:
        parts.append(_capacity_table(state))  # absent from a router that does not learn it
    parts.extend(_model_lines(state))
    parts.extend(_card_lines(state))
    parts.extend(_health_lines(state))
    parts.extend(_engine_metrics_lines(state))
    telemetry = state.get("telemetry")
    if telemetry:
        parts.extend(Text(line) for line in telemetry_lines(telemetry))
    parts.extend(Text(line, style="dim") for line in LEGEND)
    return Group(*parts)


def _header(state: State) -> list[Text]:
    queue = state["queue"]
    by_priority = " · ".join(f"{k} {v}" for k, v in queue["by_priority"].items())
    factor, band = state["imbalance_factor"], str(state["band"])
    imbalance = Text(f"imbalance {factor:.2f} ")
    imbalance.append(f"({band})", style=_BAND_STYLE.get(band, ""))
    models = state.get("by_gpu_model") or []
    if len(models) > 1:
        imbalance.append(
            "".join(f" · {m['gpu_model']} {m['imbalance_factor']:.2f}" for m in models)
        )
    return [
        Text(f"cluster {state['cluster']} · strategy {state['strategy']}"),
        Text(
            f"in {rate(state['arrivals_rps'])} req/s · out {rate(state['throughput_rps'])} req/s"
            f" · {rate(state['output_tokens_per_s'])} tok/s · in flight {state['in_flight']}"
        ),
        Text(f"queue {queue['depth']}/{queue['capacity']} ({by_priority or 'empty'})"),
        imbalance,
        *_split_line(state.get("split")),
    ]


def _split_line(split: dict[str, Any] | None) -> list[Text]:
    """The traffic split between two versions of a model, when one is set."""
    if not split:
        return []
    share = split["share"]
    return [
        Text(f"split {split['model']}: {split['new']} {share:.0%} · {split['old']} {1 - share:.0%}")
    ]


def _replica_table(state: State) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("replica")
    table.add_column("gpu")
    table.add_column("state")
    # Versions matter while a fleet runs two (a canary, a rollout, blue-green): only then.
    mixed = len({r.get("version") or r.get("model") for r in state["replicas"]}) > 1
    if mixed:
        table.add_column("version", overflow="fold")
    table.add_column("run/bat", justify="right")
    table.add_column("weight", justify="right")
    table.add_column("util", justify="right")
    table.add_column("ttft p50/p99", justify="right")
    for r in state["replicas"]:
        version = [r.get("version") or r.get("model", "")] if mixed else []
        table.add_row(
            r["id"],
            r["gpu_model"],
            state_cell(r),
            *version,
            load_cell(r),
            weight_cell(r),
            util_cell(r),
            f"{duration(r['ttft_p50_s'])}/{duration(r['ttft_p99_s'])}",
        )
    return table


def _capacity_table(state: State) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("replica")
    table.add_column("capacity")
    table.add_column("load", justify="right")
    table.add_column("kv cache")
    for r in state["replicas"]:
        table.add_row(r["id"], capacity_cell(r), pct(r["load"]), kv_cell(r))
    return table


def state_cell(r: State) -> Text:
    """The replica's state; ``warming N`` for one back in service that may run only ``N``
    requests for now (slow start; a router before it sends no ``warm_up_limit``)."""
    limit = r.get("warm_up_limit")
    if r["state"] == "active" and limit is not None:
        return Text(f"warming {limit}", style="yellow")
    return Text(r["state"], style=_STATE_STYLE.get(r["state"], ""))


def capacity_cell(r: State) -> Text:
    """Learned capacity, its source and age: ``12.4 r/s measured 3.0s``, ``8.3 r/s prior``,
    ``0.8 r/s measured 2.0s (1 at once)`` for a figure that speaks only for that many at
    once; dim while it is still the prior."""
    text = learned(
        r["capacity_rps"],
        r["capacity_source"],
        r.get("capacity_age_s"),
        r.get("capacity_measured_concurrency"),
    )
    return Text(text, style="dim" if r["capacity_source"] == "prior" else "")


def kv_cell(r: State) -> str:
    """KV-cache size and its source, and the router's booking of it where the size is certain:
    ``450k tok engine 2.0s, 62% booked``, ``80k tok fleet file, 0% booked``, ``—``."""
    size = kv(r.get("kv_capacity_tokens"), r.get("kv_capacity_source"), r.get("kv_capacity_age_s"))
    load = booked(r.get("kv_booked_tokens"), r.get("kv_capacity_tokens"), bool(r.get("kv_full")))
    return f"{size}, {load}" if load else size


def load_cell(r: State) -> str:
    """In flight over batch size: ``3/8``, ``3/4*`` when the batch size is pinned."""
    return f"{r['in_flight']}/{r['batch_size']}{PIN if r['batch_pinned'] else ''}"


def weight_cell(r: State) -> str:
    """Static over effective weight: ``1/2.5*`` when pinned, ``1/1`` by default."""
    pin = PIN if r["weight_pinned"] else ""
    return f"{number(r['static_weight'])}/{number(r['weight'])}{pin}"


def util_cell(r: State) -> Text:
    """Utilization and where it came from (see :data:`LEGEND`)."""
    if r["utilization_from_telemetry"]:
        source, style = "tel", ""
    elif r["stale"]:
        source, style = "stale", "yellow"
    else:
        source, style = "router", "dim"
    return Text(f"{pct(r['utilization'])} {source}", style=style)


def _model_lines(state: State) -> list[Text]:
    """``model: b serves Qwen2.5-7B, fleet file says Llama-3.1-8B`` for each replica whose
    ``/v1/models`` leaves out its declared model (absent from a router that does not ask)."""
    return [
        Text(f"model: {r['id']} {r['model_mismatch']}", style="red")
        for r in state["replicas"]
        if r.get("model_mismatch")
    ]


def _card_lines(state: State) -> list[Text]:
    """``card: l4-0 NVML reports NVIDIA H100 80GB HBM3, fleet file says L4`` for each replica
    whose node agent names another card than the fleet file (its prior is then modelled on
    the card NVML names)."""
    return [
        Text(f"card: {r['id']} {r['gpu_mismatch']}", style="yellow")
        for r in state["replicas"]
        if r.get("gpu_mismatch")
    ]


def _panic_lines(state: State) -> list[Text]:
    """``PANIC: 3 of 8 replicas in service healthy (panic below 50%); routing to all``."""
    panic = state.get("panic")
    if not panic:
        return []
    return [Text(f"PANIC: {panic}; routing to all", style="bold red")]


def _health_lines(state: State) -> list[Text]:
    """One line per replica the health monitor ejected, or judges unhealthy but keeps in
    service (the maximum ejected share, panic mode)."""
    lines = []
    for replica, health in (state.get("health") or {}).items():
        if not isinstance(health, Mapping):
            continue
        ejection, unhealthy = health.get("ejection"), health.get("unhealthy")
        if ejection:
            # A router before in-window probes says only when the window ends.
            probe = ejection.get("next_probe_s", ejection["remaining_s"])
            text = (
                f"health: {replica} ejected, probed again in {duration(probe)}: "
                f"{ejection['reason']}"
            )
        elif unhealthy and unhealthy.get("kept_in_service"):
            text = (
                f"health: {replica} unhealthy, kept in service ({unhealthy['kept_in_service']}): "
                f"{unhealthy['reason']}"
            )
        else:
            continue
        # One line each; --json has the whole reason.
        lines.append(Text(text, style="red", no_wrap=True, overflow="ellipsis"))
    return lines


def _engine_metrics_lines(state: State) -> list[Text]:
    """One line per replica whose engine /metrics page could not be read, or carried values
    refused as nonsense (each field kept at its last good value)."""
    polled = state.get("engine_metrics") or {}
    errors, rejected = polled.get("errors") or {}, polled.get("rejected") or {}
    lines = []
    for replica in sorted(errors.keys() | rejected.keys()):
        if replica in errors:
            text = f"engine metrics: {replica} unreadable: {errors[replica]}"
        else:
            why = (polled.get("last_rejection") or {}).get(replica, "")
            text = f"engine metrics: {replica} {rejected[replica]} refused, last good kept: {why}"
        lines.append(Text(text, style="yellow", no_wrap=True, overflow="ellipsis"))
    return lines


def telemetry_lines(telemetry: State) -> list[str]:
    """The broker connection, then the nodes (each counted once: offline, stale or live)."""
    broker = str(telemetry["broker"])
    if broker == "disabled":
        return ["telemetry: off (no broker configured)"]
    url = telemetry.get("broker_url")
    nodes = telemetry.get("nodes") or []
    offline = sum(1 for n in nodes if not n["online"])
    stale = sum(1 for n in nodes if n["online"] and n["stale"])
    dropped = telemetry.get("dropped_unknown", 0) + sum(n.get("dropped", 0) for n in nodes)
    return [
        f"telemetry: broker {broker}{f' {url}' if url else ''}",
        f"nodes: {len(nodes) - offline - stale} live, {stale} stale, {offline} offline"
        f" · {dropped} payloads dropped",
    ]


def event_line(event: State) -> str:
    """``   7 2025-06-01 12:00:03  alice  drain replica=a100-0  ok  a100-0: draining...``.

    A ``state`` or ``tune`` event shows no arguments: its message already says what changed
    (``tuner  tune  ok  v100-0: batch_size 256 -> 192 (engine queue 40 for 2 rounds)``), and
    ``--json`` has them."""
    when = datetime.fromtimestamp(event["at"]).strftime("%Y-%m-%d %H:%M:%S")
    kind = str(event["kind"])
    what = kind
    if kind not in _SELF_DESCRIBED:
        args = " ".join(f"{k}={_arg(v)}" for k, v in event["args"].items())
        what = f"{kind} {args}".rstrip()
    verdict = "ok" if event["ok"] else "REFUSED"
    return f"{event['seq']:>4} {when}  {event['actor']}  {what}  {verdict}  {event['message']}"


def decision_line(decision: State) -> str:
    """``req-12  p2c-peak-ewma -> a  (a 0.31, 2 in flight; b not eligible)  note``."""
    candidates = "; ".join(_candidate(c) for c in decision["candidates"])
    notes = " ".join(n for n in (decision.get("note"), decision.get("telemetry_note")) if n)
    chosen = decision["chosen"] or "(none)"
    line = f"{decision['request_id']}  {decision['strategy']} -> {chosen}  ({candidates})"
    return f"{line}  {notes}" if notes else line


def _candidate(c: State) -> str:
    if not c["eligible"]:
        return f"{c['replica']} not eligible"
    score = NONE if c["score"] is None else f"{c['score']:.3g}"
    return f"{c['replica']} {score}, {c['in_flight']} in flight"


def _arg(value: object) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}={v}" for k, v in value.items()) + "}"
    if value is None:
        return "release"
    return str(value)
