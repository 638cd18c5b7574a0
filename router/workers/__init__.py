"""Several router processes of one ``gpurouter serve --workers N``: the load table they share
(load_table.py), how a worker folds it into its replicas (shared_load.py), the worker process
(worker.py), the supervisor that starts, restarts and stops them (supervisor.py), and the one
admin API and /metrics of the whole service (service_admin.py, service_metrics.py).

Decision record: docs/decisions/0005-serve-workers.md.
"""

from router.workers.load_table import LoadTable

__all__ = ["LoadTable"]
