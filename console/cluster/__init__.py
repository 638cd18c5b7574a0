"""``gpurouter console --broker URL``: the cluster's routers and nodes, as its broker tells.

- :mod:`console.cluster.watch`: :class:`~console.cluster.watch.ClusterWatch`, the node
  telemetry and the routers' stats and acknowledgements, heard on the broker.
- :mod:`console.cluster.view`: what the cluster screen shows, as plain rows of text.
- :mod:`console.cluster.screen`: the cluster screen (``c`` on an attached console).
- :mod:`console.cluster.app`: the read-only console of ``--broker`` without ``--attach``.
"""
