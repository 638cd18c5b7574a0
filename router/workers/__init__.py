"""Several router processes of one ``gpurouter serve --workers N``: the load table they share
(load_table.py), how a worker folds it into its replicas (shared_load.py), the worker process
(worker.py), the supervisor that starts, restarts and stops them (supervisor.py), the one
admin API and /metrics of the whole service (service_admin.py, service_metrics.py), how a
command reaches the workers and what the service keeps of them (service_commands.py), and
the supervisor's own socket for its workers (supervisor_api.py, supervisor_client.py).

Decision records: docs/decisions/0005-serve-workers.md, and for rollouts and splits (run by
worker 0) docs/decisions/0007-rollouts-across-workers.md.
"""

from router.workers.load_table import LoadTable

__all__ = ["LoadTable"]
