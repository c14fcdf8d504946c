"""The Flight actions of a data node: ``stats`` (JSON figures for the sidecar; ``worker_locations``
lists the ``--workers`` processes this one supervises, so a standalone sidecar merges theirs too),
``report`` (a client's ClientReport protobuf), ``health`` (b"ok"; a JSON body asks for the node's
detail) and ``shard`` (a peer's cache miss). A tenant sees its own datasets' figures only
(docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow.flight as flight

from flightfeed.server.cluster import Cluster
from flightfeed.server.data.catalog import Catalog
from flightfeed.server.guards.tenants.access import TenantAccess
from flightfeed.server.guards.tenants.middleware import caller
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.reports import MAX_REPORT_BYTES, validate_report
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.observe.tenant_view import tenant_view
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import decode_report

__all__ = ["ACTIONS", "run_action"]

ACTIONS = {
    "stats": "JSON figures: throughput, streams, cache, clients, datasets",
    "report": "a client's stall/throughput report (flightfeed.v1.ClientReport)",
    "health": "b'ok' while ready (fails while draining); a JSON body asks for the node's detail",
    "shard": "a peer data node's cache miss: the bytes of one remote shard (JSON {dataset, uri})",
}


class Node(Protocol):
    """What an action reads of the service."""

    cluster: Cluster
    catalog: Catalog
    metrics: ServerMetrics
    access: TenantAccess


def run_action(server: Node, context: Any, action: flight.Action) -> Iterator[bytes]:
    """The answer to ``action`` (the service's error boundary wraps it)."""
    kind = action.type
    grant = caller(context)
    tenant = grant.tenant if grant is not None and not grant.tenant.operator else None
    if kind == "health":  # a tenant gets the plain answer, never the node's detail
        body = action.body.to_pybytes() if action.body is not None and tenant is None else b""
        return iter([server.cluster.health(body)])
    if kind == "stats" and tenant is not None:
        shown = tenant.visible(server.catalog.names())  # its datasets' figures and its row, nothing node-wide
        full = metrics_snapshot(
            server.metrics, [d.describe() for d in server.catalog.datasets() if d.name in shown],
            include_prometheus=False,
        )
        return iter([json.dumps(tenant_view(full, tenant.name, tenant.may_read)).encode()])
    if kind == "stats":
        snapshot = metrics_snapshot(server.metrics, datasets=[d.describe() for d in server.catalog.datasets()])
        pool = server.cluster.workers  # the same callable the embedded sidecar merges (serve.py)
        snapshot["worker_locations"] = pool.live() if pool is not None else []
        return iter([json.dumps(snapshot).encode()])
    if kind == "report":
        body = action.body.to_pybytes() if action.body is not None else b""
        if len(body) > MAX_REPORT_BYTES:
            raise InvalidRequest(
                f"report body is {len(body)} bytes; a ClientReport may have at most {MAX_REPORT_BYTES}",
                field="report",
            )
        names = server.access.visible(context, server.catalog.names())
        server.metrics.client_report(validate_report(decode_report(body), names))
        return iter([b"ok"])
    if kind == "shard":
        server.access.operator_only(context, "the shard action")
        from flightfeed.server.cluster.locality import serve_shard

        return serve_shard(server.catalog, action.body.to_pybytes() if action.body is not None else b"")
    raise InvalidRequest(f"unknown action {kind[:100]!r}; actions: {sorted(ACTIONS)}", field="action")
