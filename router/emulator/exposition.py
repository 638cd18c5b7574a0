"""Prometheus text exposition, written directly, line by line as prometheus_client writes it.

A replica's page carries vLLM's 39 families, about 380 samples; prometheus_client's
``generate_latest`` validates and escapes every label of every sample, about 5 ms a page,
and a router scrapes every emulated replica every few seconds from the process that also
paces their engines. The emulator knows its names and labels are valid, so it writes the
same text (counters as ``<name>_total`` with a ``<name>_created`` gauge, histograms as
``_bucket``, ``_count``, ``_sum`` and a ``_created`` gauge) in a fraction of that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

__all__ = ["Page", "label_text"]


def label_text(labels: Mapping[str, str]) -> str:
    """``engine="0",model_name="m"``: names as given, values escaped."""
    return ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items())


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class Page:
    """The lines of one exposition."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def gauge(self, name: str, help_text: str, samples: Iterable[tuple[str, float]]) -> None:
        """A gauge family; each sample is its label text and value."""
        self._head(name, "gauge", help_text)
        self._lines.extend(f"{name}{{{labels}}} {_number(v)}" for labels, v in samples)

    def counter(
        self, name: str, help_text: str, samples: Iterable[tuple[str, float]], created: float
    ) -> None:
        """A counter family (``name`` without ``_total``), and its ``_created`` gauge."""
        samples = list(samples)
        self._head(f"{name}_total", "counter", help_text)
        self._lines.extend(f"{name}_total{{{labels}}} {_number(v)}" for labels, v in samples)
        self.gauge(f"{name}_created", help_text, ((labels, created) for labels, _ in samples))

    def histogram(
        self,
        name: str,
        help_text: str,
        labels: str,
        buckets: Iterable[tuple[float, int]],
        total: float,
        created: float,
    ) -> None:
        """One labelled histogram: cumulative ``(bound, count)`` buckets up to ``+Inf``."""
        self._head(name, "histogram", help_text)
        count = 0
        for bound, count in buckets:
            self._lines.append(f'{name}_bucket{{{labels},le="{_number(bound)}"}} {count}.0')
        self._lines.append(f"{name}_count{{{labels}}} {count}.0")
        self._lines.append(f"{name}_sum{{{labels}}} {_number(total)}")
        self.gauge(f"{name}_created", help_text, [(labels, created)])

    def render(self) -> bytes:
        return ("\n".join(self._lines) + "\n").encode()

    def _head(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")
