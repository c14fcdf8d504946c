"""``flightfeed serve --workers N``: the coordinator's sidecar shows every worker process's figures.

Each worker process serves streams with its own metrics registry, so the coordinator's registry
alone undercounts (it sees the streams it serves itself and the clients' reports). An
:class:`AggregateSource` asks every worker for its ``stats`` action (the same snapshot a
standalone sidecar reads, with the Prometheus exposition inside) and merges:

* ``/metrics``: samples with the same name and labels are added across processes (counters,
  histograms, active streams, per-dataset gauges, window bytes); ``*_created`` takes the
  earliest, ``flightfeed_uptime_seconds``, ``flightfeed_cache_bytes`` (one shared cache
  directory), ``flightfeed_shared_stream_trainers`` and ratios take the largest.
  ``flightfeed_sidecar_workers_up`` says how many workers answered.
* ``/stats``: totals, rates, active streams, I/O totals, the per-dataset sent/cache figures,
  the shard cache's per-process counts (``shard_cache``: the node's own figures come from the
  shared directory, alike in every process) and the shared-jobs window figures are added
  (trainers per shared stream: the largest; identical requests meet on one process);
  ``workers`` lists who answered.

A worker that does not answer is left out (and counted as down), never fatal. The worker
locations come from a callable, so whoever starts and supervises the workers stays the source
of truth: in ``flightfeed serve``, its ``WorkerPool.live``; in the standalone sidecar
(``flightfeed sidecar``, :func:`standalone_source`), the ``worker_locations`` the coordinator's
``stats`` action lists (the same ``WorkerPool.live``), read with the coordinator's snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from flightfeed.server.sidecar.sources import FlightProbe, RemoteSource, StatsSource
from flightfeed.wire.errors import FlightFeedError

__all__ = ["AggregateSource", "merge_prometheus", "merge_stats", "standalone_source"]

_MAX = ("flightfeed_uptime_seconds", "flightfeed_cache_bytes", "flightfeed_shared_stream_trainers")
_DATASET_SUMS = (
    "rows_sent",
    "bytes_sent",
    "batches_sent",
    "streams_active",
    "rows_per_s",
    "bytes_per_s",
    "gb_per_s",
    "stream_gb_per_s",
)
_CACHE_SUMS = ("hits", "misses", "evictions", "download_seconds", "redownloads")
#: a shard cache's per-process counts (``/stats`` ``shard_cache``; the rest is the node's, read
#: from the shared directory by each process alike)
_SHARD_CACHE_SUMS = ("waits", "overdrafts", "over_limit", "asked", "released", "reclaimed")


def _combine(name: str, a: float, b: float) -> float:
    if name.endswith("_created"):
        return min(a, b)
    if name in _MAX or name.endswith("_ratio"):
        return max(a, b)
    return a + b


def merge_prometheus(texts: Iterable[str]) -> str:
    """One exposition from several processes' (same metric names; see the module doc)."""
    order: list[str] = []
    families: dict[str, tuple[str, str]] = {}  # name -> (type, help)
    samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            if fam.name not in families:
                families[fam.name] = (fam.type, fam.documentation)
                samples[fam.name] = {}
                order.append(fam.name)
            got = samples[fam.name]
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                got[key] = _combine(s.name, got[key], float(s.value)) if key in got else float(s.value)
    lines = []
    for name in order:
        kind, doc = families[name]
        lines.append(f"# HELP {name} {_escape_help(doc)}")
        lines.append(f"# TYPE {name} {kind}")
        for (sample, labels), value in samples[name].items():
            inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            text = floatToGoString(value)
            lines.append(f"{sample}{{{inner}}} {text}" if labels else f"{sample} {text}")
    return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _add(into: dict[str, Any], other: Any, keys: Sequence[str] | None = None) -> None:
    """Add ``other``'s numbers into ``into`` (recursively; ``keys``: only these)."""
    if not isinstance(other, dict):
        return
    for k, v in other.items():
        if keys is not None and k not in keys:
            continue
        mine = into.get(k)
        if isinstance(v, dict):
            if not isinstance(mine, dict):
                into[k] = mine = {}
            _add(mine, v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            into[k] = (mine if isinstance(mine, (int, float)) and not isinstance(mine, bool) else 0) + v


def merge_stats(mine: dict[str, Any], others: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The coordinator's ``/stats`` snapshot with the workers' sent/streamed figures added."""
    out: dict[str, Any] = json.loads(json.dumps(mine))  # a deep copy of plain JSON data
    for snap in others:
        for key in ("totals", "rate", "io"):
            if isinstance(snap.get(key), dict):
                into = out.setdefault(key, {})
                _add(into, snap[key] if key != "io" else {"totals": snap[key].get("totals", {})})
        _add(out, snap, ["streams_active"])
        if isinstance(out.get("cache"), dict):
            _add(out["cache"], snap.get("cache"), _CACHE_SUMS)
        by_name = {d.get("name"): d for d in out.get("datasets", []) if isinstance(d, dict)}
        for d in snap.get("datasets", []):
            target = by_name.get(d.get("name")) if isinstance(d, dict) else None
            if target is not None:
                _add(target, d, _DATASET_SUMS)
                if isinstance(target.get("cache"), dict):
                    _add(target["cache"], d.get("cache"), _CACHE_SUMS)
        _merge_shared(out, snap.get("shared"))
        _merge_shard_cache(out.get("shard_cache"), snap.get("shard_cache"))
    cache = out.get("cache")
    if isinstance(cache, dict) and isinstance(cache.get("hits"), (int, float)):
        seen = cache["hits"] + cache.get("misses", 0)
        cache["hit_ratio"] = cache["hits"] / seen if seen else None
    return out


def _merge_shard_cache(mine: Any, other: Any) -> None:
    """Add a worker's per-process shard cache counts into the coordinator's (same directory)."""
    if not isinstance(mine, list) or not isinstance(other, list):
        return
    by_dir = {c.get("directory"): c for c in mine if isinstance(c, dict)}
    for theirs in other:
        into = by_dir.get(theirs.get("directory")) if isinstance(theirs, dict) else None
        if into is not None:
            _add(into, theirs, _SHARD_CACHE_SUMS)


def _merge_shared(out: dict[str, Any], other: Any) -> None:
    """Add a worker's ``shared`` section (window figures) into ``out``'s."""
    mine = out.get("shared")
    if not isinstance(mine, dict) or not isinstance(other, dict):
        return
    for into, theirs in [(mine, other)] + [
        (mine.setdefault("datasets", {}).setdefault(name, {}), d)
        for name, d in (other.get("datasets") or {}).items()
        if isinstance(d, dict)
    ]:
        trainers = max(int(into.get("trainers") or 0), int(theirs.get("trainers") or 0))
        _add(into, {k: v for k, v in theirs.items() if k not in ("trainers", "hit_ratio", "datasets")})
        into["trainers"] = trainers
        seen = into.get("hits", 0) + into.get("misses", 0)
        into["hit_ratio"] = into.get("hits", 0) / seen if seen else None


class _Coordinator(StatsSource, Protocol):
    def close(self) -> None: ...


class AggregateSource:
    """The coordinator's figures (``local``: its :class:`LocalSource`, or the standalone sidecar's
    :class:`RemoteSource`) plus every worker's (``flightfeed serve --workers N``). ``local`` is read
    before ``workers()`` is called. ``verify_tls``: check the workers' TLS certificates (the
    standalone sidecar checks them as it checks the coordinator's; the embedded one does not)."""

    def __init__(
        self,
        local: _Coordinator,
        workers: Callable[[], Sequence[str]],
        *,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        timeout_s: float = 2.0,
        verify_tls: bool = False,
    ) -> None:
        self.local = local
        self._workers = workers
        self._probe_args: dict[str, Any] = {
            "timeout_s": timeout_s,
            "token": token,
            "tls_root_certs": tls_root_certs,
            "verify_tls": verify_tls,
        }
        self._probes: dict[str, FlightProbe] = {}

    def _worker_snapshots(self) -> tuple[list[dict[str, Any]], list[str], list[str]]:
        snaps, up, down = [], [], []
        for loc in self._workers():
            probe = self._probes.get(loc)
            if probe is None:
                probe = self._probes[loc] = FlightProbe(loc, **self._probe_args)
            try:
                snap = json.loads(probe.action("stats"))
            except (FlightFeedError, ValueError):
                down.append(loc)
                continue
            if isinstance(snap, dict):
                snaps.append(snap)
                up.append(loc)
            else:
                down.append(loc)
        return snaps, up, down

    def prometheus_text(self) -> bytes:
        texts = [self.local.prometheus_text().decode()]  # first: a RemoteSource learns the workers
        snaps, up, _ = self._worker_snapshots()
        texts += [str(s.get("prometheus_text", "")) for s in snaps]
        merged = merge_prometheus(texts)
        merged += (
            "# HELP flightfeed_sidecar_workers_up Worker processes whose figures this sidecar merged\n"
            "# TYPE flightfeed_sidecar_workers_up gauge\n"
            f"flightfeed_sidecar_workers_up {len(up)}\n"
        )
        return merged.encode()

    def stats(self) -> dict[str, Any]:
        mine = self.local.stats()  # first: a RemoteSource learns the workers
        snaps, up, down = self._worker_snapshots()
        out = merge_stats(mine, snaps)
        out["workers"] = {"merged": up, "not_answering": down}
        return out

    def ready(self) -> bool:
        return self.local.ready()

    def close(self) -> None:
        for probe in self._probes.values():
            probe.close()
        self._probes.clear()
        self.local.close()


def standalone_source(
    flight_location: str, *, timeout_s: float = 2.0, token: str | None = None, tls_root_certs: bytes | None = None
) -> AggregateSource:
    """The source of ``flightfeed sidecar --flight LOC``: the server's figures through its ``stats``
    action plus those of the worker processes it lists there (``worker_locations``), merged as the
    embedded sidecar merges them. The workers are asked with the server's token and TLS roots, and
    their certificates are checked as the server's is; readiness is the server's (``RemoteSource``)."""
    remote = RemoteSource(flight_location, timeout_s=timeout_s, token=token, tls_root_certs=tls_root_certs)
    return AggregateSource(
        remote, remote.worker_locations, token=token, tls_root_certs=tls_root_certs, timeout_s=timeout_s,
        verify_tls=True,
    )
