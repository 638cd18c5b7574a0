"""A core listener that records everything, as a driver would see it."""

from __future__ import annotations

from router.core import Assignment, CoreListener, Finished
from router.replica import Replica, ReplicaState


class Recorder(CoreListener):
    def __init__(self) -> None:
        self.assigned: list[Assignment] = []
        self.cancelled: list[Assignment] = []
        self.finished: list[Finished] = []
        self.states: list[tuple[str, ReplicaState, ReplicaState]] = []

    def on_assign(self, assignment: Assignment) -> None:
        self.assigned.append(assignment)

    def on_cancel(self, assignment: Assignment) -> None:
        self.cancelled.append(assignment)

    def on_finish(self, finished: Finished) -> None:
        self.finished.append(finished)

    def on_state(self, replica: Replica, old: ReplicaState) -> None:
        self.states.append((replica.id, old, replica.state))

    def live(self, core_running: dict[str, Assignment]) -> list[Assignment]:
        """Assignments still current in the core, oldest first."""
        return [a for a in self.assigned if core_running.get(a.request.id) is a]

    def outcome_of(self, request_id: str) -> str:
        (f,) = [f for f in self.finished if f.request.id == request_id]
        return str(f.outcome)
