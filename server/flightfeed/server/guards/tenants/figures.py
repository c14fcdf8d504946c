"""Per-tenant figures for operators: rows, bytes, streams, refusals and share, in ``/metrics``
(``flightfeed_tenant_*``) and in ``/stats`` (the ``tenants`` section). docs/security.md."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

__all__ = ["TenantFigures"]


class TenantFigures:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry
        self.rows = Counter("flightfeed_tenant_rows_total", "Rows sent to the tenant's streams", ["tenant"], registry=r)
        self.bytes = Counter(
            "flightfeed_tenant_bytes_total", "Bytes sent to the tenant's streams", ["tenant"], registry=r
        )
        self.streams = Gauge("flightfeed_tenant_streams_active", "The tenant's open streams", ["tenant"], registry=r)
        self.refusals = Counter(
            "flightfeed_tenant_refusals_total", "Calls of the tenant refused (PermissionDenied)", ["tenant"], registry=r
        )
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = {}
        self._rows: dict[str, int] = {}
        self._streams: dict[str, int] = {}
        self._refusals: dict[str, int] = {}
        if r is not None:
            r.register(_ShareCollector(self))

    def stream(self, tenant: str, delta: int) -> int:
        """Count a stream opened (+1) or ended (-1); the tenant's open streams after it."""
        with self._lock:
            n = self._streams.get(tenant, 0) + delta
            self._streams[tenant] = n
        self.streams.labels(tenant).set(n)
        return n

    def open_streams(self, tenant: str) -> int:
        return self._streams.get(tenant, 0)

    def sent(self, tenant: str, rows: int, nbytes: int) -> None:
        with self._lock:
            self._rows[tenant] = self._rows.get(tenant, 0) + rows
            self._bytes[tenant] = self._bytes.get(tenant, 0) + nbytes
        self.rows.labels(tenant).inc(rows)
        self.bytes.labels(tenant).inc(nbytes)

    def refused(self, tenant: str) -> None:
        with self._lock:
            self._refusals[tenant] = self._refusals.get(tenant, 0) + 1
        self.refusals.labels(tenant).inc()

    def snapshot(self, only: str | None = None, tenants: list[str] | None = None) -> dict[str, Any]:
        """``{tenant: {rows, bytes, streams_active, refusals, share}}`` for every tenant seen and
        every one of ``tenants`` (``only``: that tenant's row)."""
        with self._lock:
            names = set(self._bytes) | set(self._streams) | set(self._refusals) | set(tenants or ())
            total = sum(self._bytes.values())
            out = {
                n: {
                    "rows": self._rows.get(n, 0),
                    "bytes": self._bytes.get(n, 0),
                    "streams_active": self._streams.get(n, 0),
                    "refusals": self._refusals.get(n, 0),
                    "share": self._bytes.get(n, 0) / total if total else None,
                }
                for n in sorted(names)
                if only is None or n == only
            }
        return out


class _ShareCollector:
    """``flightfeed_tenant_share``: each tenant's fraction of the bytes sent (computed when scraped)."""

    def __init__(self, figures: TenantFigures) -> None:
        self.figures = figures

    def collect(self) -> Any:
        family = GaugeMetricFamily(
            "flightfeed_tenant_share", "The tenant's fraction of the bytes sent since the start", labels=["tenant"]
        )
        for name, row in self.figures.snapshot().items():
            if row["share"] is not None:
                family.add_metric([name], row["share"])
        yield family
