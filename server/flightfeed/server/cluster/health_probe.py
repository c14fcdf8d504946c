"""Ask a flightfeed process for its ``health`` detail (peers and workers are checked this way).

The ``health`` action answers ``b"ok"`` to an empty body (the sidecar's readiness probe, old
clients) and fails while the node is not ready. A body that is a JSON object asks for the
detail instead, which is answered whatever the state::

    request  {"detail": true, "node": "grpc://caller:8815", "id": "<caller's node id>"}
    answer   {"id": "<node id>", "status": "ready"|"degraded"|"draining", "node": "grpc://...",
              "processes": ["grpc://...", ...], "peers": ["grpc://...", ...],
              "datasets": {"name": "fingerprint", ...}}

``processes`` are the node's live serving processes (itself first, then its live workers);
``peers`` the other nodes it knows to be live (membership spreads through them). Between nodes
holding a cluster credential the request also carries ``nonce`` and ``proof`` and the answer a
``proof`` (``credential.ClusterKey``); the caller is learned only when its proof holds.
"""

from __future__ import annotations

import json
from typing import Any

from flightfeed.server.observe.flight_probe import FlightProbe

__all__ = ["HealthProbe", "DETAIL_KEYS"]

DETAIL_KEYS = ("id", "status", "node", "processes", "peers", "datasets")


class HealthProbe(FlightProbe):
    """A :class:`FlightProbe` that asks for the ``health`` detail (``timeout_s``, ``token`` and
    ``tls_root_certs`` as there)."""

    def detail(self, caller: dict[str, Any] | None = None) -> dict[str, Any]:
        """The process's health detail; raises FlightFeedError (no answer) or ValueError (no detail)."""
        body = json.dumps({"detail": True, **(caller or {})}).encode()
        answer = json.loads(self.action("health", body))
        if not isinstance(answer, dict) or not all(k in answer for k in DETAIL_KEYS):
            raise ValueError(f"{self.location} answered 'health' without the detail fields {DETAIL_KEYS}")
        return answer
