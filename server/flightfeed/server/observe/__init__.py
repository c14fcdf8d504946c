"""Observability: what the server counts and how others read it; nothing here shapes a stream.

``metrics`` holds the Prometheus registry (``flightfeed_*``), ``io`` the storage I/O figures,
``shared`` the shared-jobs figures (window hits, misses, bytes, trainers per shared stream),
``window`` the sliding throughput windows, ``reports`` the clients' stall reports, ``snapshot``
the JSON view behind ``/stats`` and the ``stats`` action, and ``probe`` a small Flight client
that asks a node's ``health``/``stats`` actions (used by the sidecar and the cluster).
"""

__all__: list[str] = []
