"""A worker's side of the load table: what it writes of its own load, what it reads of the
other workers'.

The router core calls :meth:`SharedLoad.publish` each time one of its own requests starts or
ends on a replica (two stores into its own row), and :meth:`SharedLoad.others` before each
pick, for every replica: the other workers' figures go into ``Replica.shared_in_flight`` and
``Replica.shared_cost``, which ``Replica.in_flight`` and ``Replica.outstanding_cost`` add, so
every strategy, the batch-size check, learned capacity and the snapshot count the whole
service's requests without being told about workers. Unlike peer routers' reports over MQTT
(router/peer_load.py), the table is as fresh as the last store, so the plain sum is exact
and there is no herd to damp.
"""

from __future__ import annotations

from router.replica import Replica
from router.workers.load_table import LoadTable

__all__ = ["SharedLoad"]


class SharedLoad:
    """Worker ``worker``'s view of a load table."""

    def __init__(self, table: LoadTable, worker: int) -> None:
        if not 0 <= worker < table.workers:
            raise ValueError(f"worker {worker} is not in a table of {table.workers}")
        self.table = table
        self.worker = worker

    def publish(self, r: Replica) -> None:
        """This worker's own requests on ``r`` changed: write them to its row."""
        self.table.write(self.worker, r.index, len(r.running), r.own_cost)

    def others(self, r: Replica) -> tuple[int, float]:
        """The other workers' requests on ``r`` and their cost, as last written."""
        return self.table.others(self.worker, r.index)
