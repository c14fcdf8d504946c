"""The chunk caches' figures: ``flightfeed_chunk_*`` metrics and the ``chunk_cache`` section of
``/stats``, read from each dataset's :class:`~flightfeed.server.data.chunk_cache.ChunkCache` when asked.

Per dataset: ``decodes`` (``flightfeed_chunk_decodes_total``: chunks decoded from storage),
``hits``, ``evictions``, ``bytes`` / ``max_bytes`` (the cache), ``held_bytes``
(``flightfeed_chunk_cache_held_bytes``: evicted chunks that view messages in flight still
reference, counted against ``max_bytes``), ``chunks`` (the dataset's decoded
chunks; 0 for memory-mapped datasets, which decode nothing) and ``decodes_per_chunk``: over one
shuffled epoch that reads every row once, 1.0 means every chunk was decoded once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from flightfeed.server.data.catalog import Catalog, Dataset
from flightfeed.server.observe.metrics import ServerMetrics

__all__ = ["install_chunk_stats", "chunk_figures"]


def _decoded_chunks(ds: Dataset) -> int:
    return sum(len(s.chunk_offsets) - 1 for s in ds.shards if not s.zero_copy)


def chunk_figures(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Dataset name -> its chunk cache's figures (see the module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for ds in catalog.datasets():
        fig: dict[str, Any] = dict(ds.chunk_cache.figures())
        chunks = _decoded_chunks(ds)
        fig["chunks"] = chunks
        fig["decodes_per_chunk"] = fig["decodes"] / chunks if chunks else None
        out[ds.name] = fig
    return out


class _Collector:
    """A prometheus_client collector (duck-typed: ``collect`` yields metric families)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def collect(self) -> Iterator[Any]:
        decodes = CounterMetricFamily(
            "flightfeed_chunk_decodes", "Chunks decoded from storage into the chunk cache", labels=["dataset"]
        )
        hits = CounterMetricFamily(
            "flightfeed_chunk_cache_hits", "Chunk reads answered by the chunk cache", labels=["dataset"]
        )
        evictions = CounterMetricFamily(
            "flightfeed_chunk_cache_evictions", "Decoded chunks dropped from the chunk cache", labels=["dataset"]
        )
        size = GaugeMetricFamily("flightfeed_chunk_cache_bytes", "Bytes of decoded chunks cached", labels=["dataset"])
        held = GaugeMetricFamily(
            "flightfeed_chunk_cache_held_bytes",
            "Bytes of evicted decoded chunks still referenced by view messages in flight",
            labels=["dataset"],
        )
        for name, fig in chunk_figures(self._catalog).items():
            decodes.add_metric([name], fig["decodes"])
            hits.add_metric([name], fig["hits"])
            evictions.add_metric([name], fig["evictions"])
            size.add_metric([name], fig["bytes"])
            held.add_metric([name], fig["held_bytes"])
        yield from (decodes, hits, evictions, size, held)


def install_chunk_stats(metrics: ServerMetrics, catalog: Catalog) -> None:
    """Register the figures on ``metrics`` (its registry and its ``/stats`` sections)."""
    metrics.registry.register(_Collector(catalog))
    metrics.sections["chunk_cache"] = lambda: chunk_figures(catalog)
