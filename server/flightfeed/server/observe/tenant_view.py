"""What a tenant may see of a node's figures (Flight ``stats`` and the sidecar's ``/stats`` with a
tenant's token): its datasets' rows (without where they are stored) and its own tenant row;
nothing node-wide, no other dataset's name, no other client's address (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["tenant_view"]

#: a dataset's fields that say where the node keeps it (the operator's to know)
_NODE_ONLY = ("uri", "path", "paths", "shards_dir", "cache_dir")


def tenant_view(snapshot: Mapping[str, Any], tenant: str, may_read: Callable[[str], bool]) -> dict[str, Any]:
    datasets = [
        {k: v for k, v in d.items() if k not in _NODE_ONLY}
        for d in snapshot.get("datasets", [])
        if isinstance(d, Mapping) and may_read(str(d.get("name")))
    ]
    rows = snapshot.get("tenants") or {}
    return {
        "version": snapshot.get("version"),
        "time": snapshot.get("time"),
        "tenant": tenant,
        "datasets": datasets,
        "tenants": {tenant: rows[tenant]} if tenant in rows else {},
    }
