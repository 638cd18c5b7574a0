"""The canary's judge: is the new version worse than the old one, over a sliding window?

It is fed every finished attempt of the split's model from the router's own accounting
(``CoreListener.on_attempt``): its time, the version of the replica that ran it, whether it
went well and its time to first byte at that replica (queueing in the router is not the
version's fault). It keeps the last ``window_s`` of them per version and, when both versions
finished at least ``min_requests`` in the window, compares two figures:

- the error rate: worse when the new version's exceeds the old one's by more than
  ``max_error_rate_increase`` (an absolute difference: 0.05 is five percentage points);
- the p99 TTFT of the attempts that went well (nearest rank): worse when the new version's
  exceeds ``max_ttft_ratio`` times the old one's **on the same card** (GPU model and count),
  on each card where both versions have at least ``min_requests`` in the window. In a fleet
  of different cards the old version's p99 over the whole fleet is its slowest cards' tail,
  behind which a new version slow on a strong card could hide (an A100 at 0.5 s passed
  against V100s at 0.3 s where the old A100s answered in 0.2 s). Only where no card runs
  both versions are the two compared across cards, as a whole.

Pure: the time of each observation and of each verdict is given by the caller.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from router.config.schema import CanaryConfig

__all__ = ["Figures", "Judge", "Verdict"]


@dataclass(frozen=True, slots=True)
class Figures:
    """One version's attempts in the window."""

    requests: int
    errors: int
    p99_ttft_s: float | None
    """None: no attempt went well."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def text(self) -> str:
        ttft = "-" if self.p99_ttft_s is None else f"{self.p99_ttft_s * 1000:.0f} ms"
        return (
            f"error rate {self.error_rate:.1%} ({self.errors} of {self.requests}), p99 TTFT {ttft}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": self.error_rate,
            "p99_ttft_s": self.p99_ttft_s,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """The new version is worse: why, with both versions' figures."""

    reason: str
    new: Figures
    old: Figures

    def text(self, new: str, old: str) -> str:
        return f"{self.reason}: {new} {self.new.text()}; {old} {self.old.text()}"


@dataclass(frozen=True, slots=True)
class _Attempt:
    time: float
    ok: bool
    ttft_s: float | None
    card: str


class Judge:
    def __init__(self, rules: CanaryConfig) -> None:
        self.rules = rules
        self._seen: dict[bool, deque[_Attempt]] = {True: deque(), False: deque()}
        """Attempts per side: True the new version, False the old."""

    def observe(
        self, new: bool, time: float, ok: bool, ttft_s: float | None, card: str = ""
    ) -> None:
        """An attempt on the new (``new``) or old version ended at ``time``, on a replica of
        ``card`` (what its TTFT is compared on; ``""``: not said, compared as a whole)."""
        self._seen[new].append(_Attempt(time, ok, ttft_s if ok else None, card))

    def figures(self, now: float) -> tuple[Figures, Figures]:
        """(new, old) over the window that ends at ``now``."""
        self._forget(now)
        return _figures(self._seen[True]), _figures(self._seen[False])

    def verdict(self, now: float) -> Verdict | None:
        """Why the new version is worse now, or None (not worse, or too few requests)."""
        new, old = self.figures(now)
        need = self.rules.min_requests
        if new.requests < need or old.requests < need:
            return None
        margin = self.rules.max_error_rate_increase
        if new.error_rate - old.error_rate > margin:
            reason = f"error rate worse by more than {margin:.0%} points"
            return Verdict(reason, new, old)
        ratio = self.rules.max_ttft_ratio
        for where, new_on, old_on in self._comparisons(new, old):
            new_p99, old_p99 = new_on.p99_ttft_s, old_on.p99_ttft_s
            if new_p99 is not None and old_p99 is not None and new_p99 > ratio * old_p99:
                return Verdict(
                    f"p99 TTFT more than {ratio:g} times the old one's{where}", new_on, old_on
                )
        return None

    def _comparisons(self, new: Figures, old: Figures) -> list[tuple[str, Figures, Figures]]:
        """What the TTFTs are compared on: each card both versions ran at least
        ``min_requests`` on, or, where there is none, the two versions as a whole."""
        need = self.rules.min_requests
        on: dict[bool, dict[str, list[_Attempt]]] = {True: {}, False: {}}
        for side, seen in self._seen.items():
            for a in seen:
                on[side].setdefault(a.card, []).append(a)
        same = [
            (f" on {card}", _figures(on[True][card]), _figures(on[False][card]))
            for card in sorted(on[True].keys() & on[False].keys())
            if card and len(on[True][card]) >= need and len(on[False][card]) >= need
        ]
        return same or [("", new, old)]

    def _forget(self, now: float) -> None:
        start = now - self.rules.window_s
        for seen in self._seen.values():
            while seen and seen[0].time < start:
                seen.popleft()


def _figures(seen: Sequence[_Attempt]) -> Figures:
    errors = sum(1 for a in seen if not a.ok)
    ttfts = sorted(a.ttft_s for a in seen if a.ttft_s is not None)
    p99 = ttfts[max(0, math.ceil(0.99 * len(ttfts)) - 1)] if ttfts else None
    return Figures(len(seen), errors, p99)
