"""Storage I/O metrics: read-ahead, read wait, shards changed in place, shard verification.

Registered on the server's ``CollectorRegistry`` by :class:`~flightfeed.server.observe.metrics.ServerMetrics`
(as ``metrics.io``); ``snapshot`` gives the same figures per dataset for ``/stats``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

__all__ = ["IoMetrics"]


class IoMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.shard_changes = Counter(
            "flightfeed_shard_changes",
            "Shards found truncated or overwritten in place while served (dataset marked changed)",
            ["dataset"],
            registry=r,
        )
        self.prefetch_bytes = Counter(
            "flightfeed_prefetch_bytes", "Bytes of upcoming blocks read ahead of need", ["dataset"], registry=r
        )
        self.prefetch_hits = Counter(
            "flightfeed_prefetch_hits",
            "Messages whose rows had been read ahead before the stream needed them",
            ["dataset"],
            registry=r,
        )
        self.prefetch_misses = Counter(
            "flightfeed_prefetch_misses",
            "Messages whose rows had not been read ahead when the stream needed them",
            ["dataset"],
            registry=r,
        )
        self.read_wait = Counter(
            "flightfeed_read_wait_seconds",
            "Seconds streams spent producing messages from storage (page faults, decoding, gathering)",
            ["dataset"],
            registry=r,
        )
        self.shards_verified = Counter(
            "flightfeed_shards_verified",
            "Shards whose sha256 was checked against the manifest",
            ["dataset"],
            registry=r,
        )
        self.verify_failures = Counter(
            "flightfeed_verify_failures",
            "Shards whose sha256 did not match the manifest (dataset marked corrupt)",
            ["dataset"],
            registry=r,
        )
        self._all = {
            "shard_changes": self.shard_changes,
            "prefetch_bytes": self.prefetch_bytes,
            "prefetch_hits": self.prefetch_hits,
            "prefetch_misses": self.prefetch_misses,
            "read_wait_s": self.read_wait,
            "shards_verified": self.shards_verified,
            "verify_failures": self.verify_failures,
        }

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Dataset -> figure -> value (every figure of ``_all``, 0 where not counted yet)."""
        out: dict[str, dict[str, float]] = {}
        for key, counter in self._all.items():
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        name = str(sample.labels.get("dataset", ""))
                        out.setdefault(name, dict.fromkeys(self._all, 0.0))[key] = float(sample.value)
        return out

    def totals(self) -> dict[str, Any]:
        per = self.snapshot()
        return {key: sum(v[key] for v in per.values()) for key in self._all}
