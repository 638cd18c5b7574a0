"""The MQTT feeds' drops on /metrics: telemetry payloads and control messages the router
dropped, read from its :class:`~router.telemetry.status.TelemetryStatus` when Prometheus
scrapes (they were in the admin state only).

| metric | type | labels |
|---|---|---|
| ``gpurouter_telemetry_dropped_total`` | counter | ``reason`` (``TelemetryStatus.drop_reasons``) |
| ``gpurouter_telemetry_overflowed_total`` | counter | |
| ``gpurouter_telemetry_ignored_total`` | counter | |
| ``gpurouter_telemetry_lost_samples_total`` | counter | ``node`` |
| ``gpurouter_telemetry_connected`` | gauge (1 while connected to the broker) | |
| ``gpurouter_control_dropped_total`` | counter | ``reason`` (``ControlLinkStatus.refused``) |
| ``gpurouter_control_stale_total`` | counter | |

Nothing is written for a router without a feed (no source, or a disabled one), and the
control families only where the status carries a control link's. Every label value is a
fixed reason or a node of the fleet file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.telemetry.status import BrokerState, ControlLinkStatus, TelemetryStatus

__all__ = ["FeedCollector"]

TelemetrySource = Callable[[], TelemetryStatus | None]


class FeedCollector(Collector):
    """Reads the status ``source`` gives (None: no feed) at scrape time."""

    def __init__(self, source: TelemetrySource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        status = self._source()
        if status is None or status.broker is BrokerState.DISABLED:
            return
        yield from _telemetry(status)
        if status.control is not None:
            yield from _control(status.control)


def _telemetry(status: TelemetryStatus) -> Iterable[Metric]:
    yield _by_label(
        "gpurouter_telemetry_dropped",
        "Telemetry payloads dropped (malformed, oversized, of an older session...), by reason.",
        "reason",
        status.drop_reasons,
    )
    yield CounterMetricFamily(
        "gpurouter_telemetry_overflowed",
        "Telemetry messages discarded unread because the subscriber fell behind.",
        status.overflowed,
    )
    yield CounterMetricFamily(
        "gpurouter_telemetry_ignored",
        "Messages on topics the telemetry subscriber did not ask for, unread.",
        status.ignored,
    )
    yield _by_label(
        "gpurouter_telemetry_lost_samples",
        "GPU samples a node's sequence numbers skipped (lost by the broker or the network).",
        "node",
        {node.node: node.lost_samples for node in status.nodes},
    )
    yield GaugeMetricFamily(
        "gpurouter_telemetry_connected",
        "1 while the telemetry subscriber is connected to the broker.",
        float(status.broker is BrokerState.CONNECTED),
    )


def _control(link: ControlLinkStatus) -> Iterable[Metric]:
    yield _by_label(
        "gpurouter_control_dropped",
        "Control messages dropped (unsigned, malformed, from the future...), by reason.",
        "reason",
        link.refused,
    )
    yield CounterMetricFamily(
        "gpurouter_control_stale",
        "Control messages older than the command applied on their slot (ignored).",
        link.stale,
    )


def _by_label(name: str, documentation: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family
