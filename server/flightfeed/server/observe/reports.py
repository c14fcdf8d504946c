"""The clients that sent ``report`` actions: validated figures in a bounded, ordered table.

A report is untrusted input from any client: :func:`validate_report` checks every field (length
and characters of the strings, a served dataset, rank below world size, finite non-negative
figures, the stall ratio in [0, 1]) and raises :class:`InvalidRequest` naming the field.
:class:`ClientTable` keeps at most ``max_clients`` clients ordered by their last report: a new
client beyond the cap evicts the one that reported least recently (counted), and clients silent
for ``forget_s`` are dropped. Every operation is O(1) amortised, whatever the number of clients.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any

from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import MAX_WORLD

__all__ = [
    "ClientTable",
    "validate_report",
    "MAX_CLIENTS",
    "MAX_CLIENT_ID_CHARS",
    "MAX_REPORT_BYTES",
]

MAX_CLIENTS = 1024  # clients tracked at once (the oldest is evicted beyond)
MAX_CLIENT_ID_CHARS = 128
MAX_DEVICE_CHARS = 64
MAX_REPORT_BYTES = 4096  # a ClientReport is ~100 bytes
MAX_NODES = 1 << 16  # data nodes one client may read from
_MAX_COUNT = (1 << 63) - 1
_FLOATS = ("stall_ratio", "rows_per_s", "bytes_per_s", "wait_s", "elapsed_s")
_COUNTS = ("rows_total", "bytes_total")


def _text(value: str, field: str, limit: int, *, required: bool) -> str:
    if required and not value:
        raise InvalidRequest(f"report.{field} is empty: every report names its {field}", field=f"report.{field}")
    if len(value) > limit:
        raise InvalidRequest(
            f"report.{field} is {len(value)} characters long; at most {limit} are allowed", field=f"report.{field}"
        )
    if not value.isprintable():
        raise InvalidRequest(
            f"report.{field} {value[:40]!r} contains control characters; use printable text", field=f"report.{field}"
        )
    return value


def validate_report(report: Any, datasets: Collection[str]) -> dict[str, Any]:
    """The checked figures of a ClientReport message (``datasets``: the served dataset names)."""
    fig: dict[str, Any] = {
        "client_id": _text(str(report.client_id), "client_id", MAX_CLIENT_ID_CHARS, required=True),
        "dataset": _text(str(report.dataset), "dataset", 256, required=False),
        "device": _text(str(report.device), "device", MAX_DEVICE_CHARS, required=False),
    }
    if fig["dataset"] and fig["dataset"] not in datasets:  # empty: a report not tied to a dataset
        raise InvalidRequest(
            f"report.dataset {fig['dataset']!r} is not served here; served datasets: {', '.join(sorted(datasets))}",
            field="report.dataset",
        )
    world = int(report.world_size) or 1  # proto3: 0 = not set
    if world > MAX_WORLD:
        raise InvalidRequest(f"report.world_size is {world}; allowed: 1..{MAX_WORLD}", field="report.world_size")
    if int(report.rank) >= world:
        raise InvalidRequest(
            f"report.rank is {report.rank}; allowed: 0..{world - 1} for world_size {world}", field="report.rank"
        )
    fig["rank"], fig["world_size"] = int(report.rank), world
    for name in _FLOATS:
        value = float(getattr(report, name))
        if not math.isfinite(value) or value < 0:
            raise InvalidRequest(f"report.{name} is {value}; it must be finite and >= 0", field=f"report.{name}")
        fig[name] = value
    if fig["stall_ratio"] > 1:
        raise InvalidRequest(
            f"report.stall_ratio is {fig['stall_ratio']}; allowed: 0..1", field="report.stall_ratio"
        )
    for name in _COUNTS:
        value = int(getattr(report, name))
        if value > _MAX_COUNT:
            raise InvalidRequest(f"report.{name} is {value}; allowed: 0..{_MAX_COUNT}", field=f"report.{name}")
        fig[name] = value
    nodes = int(report.nodes)
    if nodes > MAX_NODES:
        raise InvalidRequest(f"report.nodes is {nodes}; allowed: 0..{MAX_NODES}", field="report.nodes")
    fig["nodes"] = nodes
    return fig


class ClientTable:
    """Client id -> its last figures (plus ``received_at``), at most ``max_clients`` of them,
    least recently reported first. Not thread-safe: the caller holds a lock."""

    def __init__(self, max_clients: int = MAX_CLIENTS, forget_s: float = 600.0) -> None:
        if max_clients < 1:
            raise ValueError("max_clients must be >= 1")
        self.max_clients = max_clients
        self.forget_s = forget_s
        self.evicted = 0  # clients dropped because the table was full
        self._rows: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, client_id: str) -> dict[str, Any] | None:
        return self._rows.get(client_id)

    def put(self, fig: Mapping[str, Any], now: float) -> list[dict[str, Any]]:
        """Record ``fig`` (its ``client_id``) at ``now``; returns the rows dropped (evicted or
        forgotten), so the caller can remove their metric series."""
        client = str(fig["client_id"])
        self._rows.pop(client, None)
        self._rows[client] = dict(fig, received_at=now)
        dropped = self.forget(now)
        while len(self._rows) > self.max_clients:
            _, row = self._rows.popitem(last=False)
            self.evicted += 1
            dropped.append(row)
        return dropped

    def forget(self, now: float) -> list[dict[str, Any]]:
        """Drop the clients silent for longer than ``forget_s``; returns them."""
        dropped = []
        while self._rows:
            client, row = next(iter(self._rows.items()))
            if now - row["received_at"] <= self.forget_s:
                break
            del self._rows[client]
            dropped.append(row)
        return dropped

    def rows(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows.values()]
