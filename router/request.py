"""A request as the router sees it: size, urgency, deadline, and where it has been tried."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Priority(IntEnum):
    """Lower value is served first."""

    HIGH = 0
    NORMAL = 1
    LOW = 2

    @classmethod
    def parse(cls, text: str | int) -> Priority:
        """Accept a name (``high``) or a number (``0``); raise ValueError otherwise."""
        if isinstance(text, int) or text.strip().lstrip("-").isdigit():
            return cls(int(text))
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(p.name.lower() for p in cls)
            raise ValueError(f"unknown priority {text!r}; expected one of {names}") from None


def estimate_cost(prompt_tokens: int, max_tokens: int, prompt_factor: float = 0.5) -> float:
    """The usual load estimate: a prompt token costs ``prompt_factor`` of a generated one."""
    return prompt_tokens * prompt_factor + max_tokens


@dataclass(slots=True, eq=False)
class Request:
    """One inference request; mutable only through the router core."""

    id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    """Router clock time the request arrived."""
    priority: Priority = Priority.NORMAL
    deadline: float | None = None
    """Router clock time by which it must leave the queue, or None."""
    affinity_key: str | None = None
    model: str | None = None
    cost: float = 0.0
    """Estimated cost; set by the core from the cost model when left at 0."""
    attempts: int = 0
    """Attempts started so far (a preemption does not count as a failed attempt)."""
    avoid: set[int] = field(default_factory=set)
    """Replica indexes this request failed on; retries go elsewhere when they can."""
    version: str | None = None
    """The version a traffic split sends it to, set by the core before each pick (None: any
    replica that serves ``model``; router/rollout/split.py)."""
    split_coin: float | None = None
    """Its draw in [0, 1) for the split, made once when it arrives: a request keeps its side
    while it waits, whatever the share does between picks only moves the threshold."""
    split_failed: str | None = None
    """The version an attempt of it failed on: its retry goes to the other side."""
    waiting_ahead: int = 0
    """Requests ahead of it in the router's queue that the dispatch now under way could not
    place (set by the core before each pick): they take the next free slots first."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus the most it may generate: what a replica must hold."""
        return self.prompt_tokens + self.max_tokens
