"""``gpurouter console --attach URL``: the console on a router running elsewhere.

- :mod:`console.attach.backend`: :func:`~console.attach.backend.attach` and the
  :class:`~console.attach.backend.RemoteBackend` the console reads and steers through.
- :mod:`console.attach.admin_http`: the admin API, asked without blocking the loop.
- :mod:`console.attach.state`: the admin API's JSON as the console's snapshot types.
- :mod:`console.attach.rebuild`: JSON back into frozen dataclasses, by their type hints.
- :mod:`console.attach.events`: the audit trail, followed across dropped connections.
- :mod:`console.attach.link`: whether the router answers, and the backoff while it does not.
"""
