"""The console's short durations: what an age or a latency reads as at its smallest."""

from __future__ import annotations

import pytest

from console.view.format import duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.0, "<1ms"), (0.000_02, "<1ms"), (0.000_99, "<1ms"), (0.001, "1ms"), (0.0423, "42ms")],
)
def test_under_a_millisecond_reads_as_under_a_millisecond_not_in_microseconds(
    seconds: float, shown: str
) -> None:
    """A decision made in the snapshot's instant was `0us ago`; it is `<1ms ago`."""
    assert duration(seconds) == shown
