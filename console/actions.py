"""THE registry of operator actions: one table feeds keys, footer, help, palette and read-only.

An action is data: an id (what ``console.keys`` in the fleet file rebinds), a title for the
footer, a one-line description for the help screen and the command palette, a default key,
whether it changes the router (read-only consoles refuse those), whether it asks first, and
whether it acts on the selected replica. The app turns each into a Textual ``Binding`` with
the action's id; nothing else in the console lists keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from textual.binding import Binding
from textual.keys import _character_to_key

from router.errors import ConfigError, Problem


@dataclass(frozen=True, slots=True)
class Action:
    id: str
    title: str
    """A word or two, for the footer and the palette."""
    description: str
    """One line, for the help screen and the palette."""
    key: str
    """Default key (a Textual key name); the fleet file's ``console.keys`` can change it."""
    mutates: bool = False
    """Changes the router: absent from a read-only console and refused there."""
    confirm: bool = False
    """Destructive: a confirmation naming the replica and the impact comes first."""
    target: bool = False
    """Acts on the replica selected in the fleet table (or named in the palette)."""
    footer: bool = True
    """Shown in the footer (the rest are in the help screen and the palette)."""
    broker: bool = False
    """Offered only by a console watching a cluster's broker (``--broker``): elsewhere it is
    absent from the keys, the help screen and the palette."""


ACTIONS: tuple[Action, ...] = (
    Action("help", "Help", "Show every key and action", "question_mark"),
    Action(
        "palette",
        "Commands",
        "Open the command palette: every action by name",
        "colon",
        footer=False,
    ),
    Action(
        "strategy",
        "Strategy",
        "Switch the routing strategy (picker with summaries)",
        "s",
        mutates=True,
    ),
    Action(
        "weight",
        "Weight",
        "Set or release the selected replica's weight",
        "w",
        mutates=True,
        target=True,
    ),
    Action(
        "batch",
        "Batch",
        "Set or release the selected replica's batch size",
        "b",
        mutates=True,
        target=True,
        footer=False,
    ),
    Action(
        "drain",
        "Drain",
        "Drain the selected replica: no new work; in-flight finishes",
        "d",
        mutates=True,
        confirm=True,
        target=True,
    ),
    Action(
        "undrain",
        "Undrain",
        "Return a draining or drained replica to service",
        "u",
        mutates=True,
        target=True,
        footer=False,
    ),
    Action(
        "preempt",
        "Preempt",
        "Stop its normal and low-priority work now; it stays drained",
        "p",
        mutates=True,
        confirm=True,
        target=True,
    ),
    Action(
        "eject",
        "Eject",
        "Take the selected replica out of service",
        "e",
        mutates=True,
        confirm=True,
        target=True,
        footer=False,
    ),
    Action(
        "readmit",
        "Readmit",
        "Return an ejected replica to service",
        "r",
        mutates=True,
        target=True,
        footer=False,
    ),
    Action(
        "rollout",
        "Roll",
        "Roll out a model version, or watch and steer the one going",
        "v",
    ),
    Action(
        "split",
        "Split",
        "Canary or blue-green: start, watch and steer a split",
        "g",
        footer=False,
    ),
    Action(
        "detail",
        "Detail",
        "Open the selected replica: capacity, latency, decisions",
        "i",
        target=True,
        footer=False,
    ),
    Action(
        "cluster",
        "Cluster",
        "Show every router and node of the cluster, as its broker tells (--broker)",
        "c",
        footer=False,
        broker=True,
    ),
    Action("filter", "Filter", "Filter rows by replica, node, GPU model or state", "slash"),
    Action("sort", "Sort", "Cycle the fleet table's sort order", "o", footer=False),
    Action("theme", "Theme", "Switch to the next theme", "t", footer=False),
    Action("pause", "Pause", "Pause or resume the live refresh", "space", footer=False),
    Action("faster", "Faster", "Refresh more often", "plus", footer=False),
    Action("slower", "Slower", "Refresh less often", "minus", footer=False),
    Action("quit", "Quit", "Leave the console (the router in it stops too)", "q"),
)

BY_ID: Mapping[str, Action] = {a.id: a for a in ACTIONS}

RESERVED_KEYS: frozenset[str] = frozenset(
    {"ctrl+a", "ctrl+b", "ctrl+c", "ctrl+d", "ctrl+s", "ctrl+q", "ctrl+z", "ctrl+backslash"}
)
"""Keys the defaults leave alone: tmux and screen prefixes, the shell's EOF and job control,
terminal flow control."""


def normalize_key(key: str) -> str:
    """``?`` -> ``question_mark``; key names pass through lower-cased where single-key."""
    key = key.strip()
    if len(key) == 1:
        return _character_to_key(key)
    return key


def resolve_keys(overrides: Mapping[str, str], source: Path | str | None = None) -> dict[str, str]:
    """Action id -> key after the fleet file's rebindings; ConfigError lists every problem."""
    where = str(source or "fleet")
    problems: list[Problem] = []
    keys = {a.id: a.key for a in ACTIONS}
    for action_id, key in overrides.items():
        if action_id not in BY_ID:
            known = ", ".join(BY_ID)
            problems.append(
                Problem(where, None, f"console.keys.{action_id}", f"no such action; known: {known}")
            )
        elif not isinstance(key, str) or not key.strip() or " " in key.strip():
            problems.append(
                Problem(where, None, f"console.keys.{action_id}", f"not a key name: {key!r}")
            )
        else:
            keys[action_id] = normalize_key(key)
    owners: dict[str, str] = {}
    for action_id, key in keys.items():
        if key in owners:
            problems.append(
                Problem(
                    where,
                    None,
                    f"console.keys.{action_id}",
                    f"{key} is already the key of {owners[key]}",
                )
            )
        owners.setdefault(key, action_id)
    if problems:
        raise ConfigError(problems)
    return keys


def bindings(keys: Mapping[str, str]) -> list[Binding]:
    """One Textual binding per action, with the action's id (what ``set_keymap`` rebinds).

    A read-only console greys the mutating ones out through the app's ``check_action``.
    """
    return [
        Binding(
            keys[a.id],
            f"app.run_registered('{a.id}')",
            a.title,
            show=a.footer,
            tooltip=a.description,
            id=a.id,
        )
        for a in ACTIONS
    ]


def offered(broker: bool) -> list[Action]:
    """The actions a console has: those needing a broker only where it watches one."""
    return [a for a in ACTIONS if broker or not a.broker]


def visible(read_only: bool, broker: bool = False) -> list[Action]:
    """The actions a console offers in its palette: all it has, or only watching ones."""
    return [a for a in offered(broker) if not (read_only and a.mutates)]
