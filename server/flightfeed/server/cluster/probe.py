"""Ask a flightfeed process for its ``health`` detail (peers and workers are checked this way).

The ``health`` action answers ``b"ok"`` to an empty body (the sidecar's readiness probe, old
clients) and fails while the node is not ready. A body that is a JSON object asks for the
detail instead, which is answered whatever the state::

    request  {"detail": true, "node": "grpc://caller:8815", "id": "<caller's node id>"}
    answer   {"id": "<node id>", "status": "ready"|"degraded"|"draining", "node": "grpc://...",
              "processes": ["grpc://...", ...], "peers": ["grpc://...", ...],
              "datasets": {"name": "fingerprint", ...}}

``processes`` are the node's live serving processes (itself first, then its live workers);
``peers`` the other nodes it knows to be live (membership spreads through them).
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import pyarrow.flight as flight

__all__ = ["HealthProbe", "DETAIL_KEYS"]

DETAIL_KEYS = ("id", "status", "node", "processes", "peers", "datasets")


class HealthProbe:
    """One FlightClient to one process, for ``health`` detail requests with a timeout."""

    def __init__(
        self,
        location: str,
        *,
        timeout_s: float = 2.0,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
    ) -> None:
        self.location = location
        headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(timeout=timeout_s, headers=headers)
        self._tls_root_certs = tls_root_certs
        self._client: flight.FlightClient | None = None
        self._lock = threading.Lock()

    def detail(self, caller: dict[str, Any] | None = None) -> dict[str, Any]:
        """The process's health detail; raises ``flight.FlightError``/``OSError``/``ValueError``."""
        with self._lock:
            if self._client is None:
                kwargs: dict[str, Any] = {"tls_root_certs": self._tls_root_certs} if self._tls_root_certs else {}
                self._client = flight.FlightClient(self.location, **kwargs)
            client = self._client
        body = json.dumps({"detail": True, **(caller or {})}).encode()
        try:
            results = client.do_action(flight.Action("health", body), self._options)
            answer = json.loads(b"".join(r.body.to_pybytes() for r in results))
        except Exception:
            self.close()
            raise
        if not isinstance(answer, dict) or not all(k in answer for k in DETAIL_KEYS):
            raise ValueError(f"{self.location} answered 'health' without the detail fields {DETAIL_KEYS}")
        return answer

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
