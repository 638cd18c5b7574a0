"""Blue-green: a second set of replicas (green) on the new version, declared in the fleet file
(each with ``version: V``, and ``rollout.green: V``), held out of their model's traffic by a
split at 0% until the operator switches.

- **switch**: every request for the model goes to the green set (the split at 100%), and the
  blue set is drained; the status counts down the requests still in flight on it, and an
  audit event says when it is empty.
- **switch back** (until the blue set is released): the blue set is readmitted and the split
  goes back to 0%.
- **release**, once the blue set is empty: the split ends (requests go by name, so to green),
  the blue set stays drained for its owner to shut down.

Every change is an audit event of kind ``rollout``; the drains and undrains are ordinary
``drain`` and ``undrain`` events with actor ``rollout``.
"""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Any

from router.control import ControlSurface, Drain, EndSplit, SetSplit, Undrain
from router.core import CoreListener, RouterCore
from router.errors import RolloutError
from router.replica import Replica, ReplicaState
from router.rollout.command_path import CommandPath
from router.rollout.split import TrafficSplit

__all__ = ["BlueGreen", "BlueGreenPhase"]

ACTOR = "rollout"
_ids = itertools.count(1)


class BlueGreenPhase(StrEnum):
    BLUE = "blue"
    """The blue set takes the model's requests; green stands by."""
    SWITCHED = "switched"
    """Green takes them all; blue drains (or is drained)."""
    RELEASED = "released"


class BlueGreen(CoreListener):
    def __init__(
        self,
        core: RouterCore,
        control: ControlSurface,
        green: str,
        path: CommandPath | None = None,
    ) -> None:
        """RolloutError when no replica runs ``green`` or they serve several models.
        ``path``: how a switch's split, drains and undrains are given (the manager's,
        router/rollout/command_path.py); by default on this router alone. The split at 0%
        that holds green out from the start is set here, on this router: every router and
        worker sets it from its own fleet file."""
        self.core = core
        self.control = control
        self.path = path if path is not None else CommandPath(control)
        self.id = f"blue-green-{next(_ids)}"
        self.green = green
        greens = [r for r in core.pool if r.version == green]
        models = {r.config.model for r in greens}
        if len(models) != 1:
            raise RolloutError(f"the green set ({green}) must be replicas of one model")
        self.model = models.pop()
        self.green_ids = tuple(r.id for r in greens)
        blues = [r for r in core.pool if r.config.model == self.model and r.version != green]
        if not blues:
            raise RolloutError(f"every replica of {self.model} is green; there is no blue set")
        self.blue_ids = tuple(r.id for r in blues)
        self.blue = blues[0].version
        self.phase = BlueGreenPhase.BLUE
        self.emptied = False
        """The blue set has held nothing since the last switch (told once)."""
        core.set_split(self._traffic(0.0))
        core.listeners.append(self)

    def switch(self, actor: str) -> None:
        if self.phase is not BlueGreenPhase.BLUE:
            raise RolloutError(f"{self.id} is {self.phase}; only a blue set switches to green")
        if not any(self.core.replica(g).state is ReplicaState.ACTIVE for g in self.green_ids):
            raise RolloutError(f"no green replica ({', '.join(self.green_ids)}) is in service")
        self.phase = BlueGreenPhase.SWITCHED
        self.emptied = False
        self._split(1.0)
        held = self.in_flight()
        message = f"{self.id}: {self.model} to {self.green}; drains {self.blue} ({held} in flight)"
        self._note(actor, "switch", message)
        for rid in self.blue_ids:
            if self.core.replica(rid).state is ReplicaState.ACTIVE:
                self.path.send(Drain(rid), ACTOR)
        self._check_empty()

    def switch_back(self, actor: str) -> None:
        if self.phase is not BlueGreenPhase.SWITCHED:
            raise RolloutError(f"{self.id} is {self.phase}; only a switched set switches back")
        self.phase = BlueGreenPhase.BLUE
        for rid in self.blue_ids:
            if self.core.replica(rid).state in (ReplicaState.DRAINING, ReplicaState.DRAINED):
                self.path.send(Undrain(rid), ACTOR)
        self._split(0.0)
        self._note(actor, "switch back", f"{self.id}: {self.model} back to {self.blue}")

    def release(self, actor: str) -> None:
        if self.phase is not BlueGreenPhase.SWITCHED:
            raise RolloutError(f"{self.id} is {self.phase}; only a switched set is released")
        held = self.in_flight()
        if held:
            raise RolloutError(f"the blue set still holds {held} requests; release it when empty")
        self.phase = BlueGreenPhase.RELEASED
        self.path.send(EndSplit(), ACTOR)
        self.close()
        blues = ", ".join(self.blue_ids)
        self._note(actor, "release", f"{self.id}: {blues} released; {self.green} serves it all")

    def close(self) -> None:
        if self in self.core.listeners:
            self.core.listeners.remove(self)

    def in_flight(self) -> int:
        """Requests still running on the blue set."""
        return sum(self.core.replica(rid).in_flight for rid in self.blue_ids)

    def status(self) -> dict[str, Any]:
        def replicas(ids: tuple[str, ...]) -> dict[str, Any]:
            return {
                rid: {
                    "state": str(self.core.replica(rid).state),
                    "version": self.core.replica(rid).version,
                    "in_flight": self.core.replica(rid).in_flight,
                }
                for rid in ids
            }

        if self.phase is BlueGreenPhase.SWITCHED:
            self._check_empty()  # the blue set's last requests may have been another worker's
        split = self.core.split
        return {
            "id": self.id,
            "kind": "blue-green",
            "model": self.model,
            "old": self.blue,
            "new": self.green,
            "phase": str(self.phase),
            "share": 1.0 if self.phase is BlueGreenPhase.RELEASED else _share(split),
            "blue": replicas(self.blue_ids),
            "green": replicas(self.green_ids),
            "in_flight": self.in_flight(),
            "emptied": self.emptied,
        }

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        if self.phase is BlueGreenPhase.SWITCHED and replica.id in self.blue_ids:
            self._check_empty()

    def _check_empty(self) -> None:
        if self.emptied or self.in_flight():
            return
        drained = all(self.core.replica(r).state is not ReplicaState.ACTIVE for r in self.blue_ids)
        if drained:
            self.emptied = True
            message = f"{self.id}: the blue set ({', '.join(self.blue_ids)}) is empty"
            self._note(ACTOR, "blue empty", message)

    def _split(self, share: float) -> None:
        self.path.send(SetSplit(self.model, self.blue, self.green, share), ACTOR)

    def _traffic(self, share: float) -> TrafficSplit:
        return TrafficSplit(self.model, self.blue, self.green, share)

    def _note(self, actor: str, step: str, message: str) -> None:
        args = {"blue_green": self.id, "step": step, "version": self.green}
        self.control.note(actor, "rollout", args, True, message)


def _share(split: TrafficSplit | None) -> float:
    return 0.0 if split is None else split.share
