"""Cache locality over the data nodes (shards from object storage, e.g. S3).

Each shard has a *preferred node*: the live node with the highest rendezvous hash of (node, shard
URI), so every node agrees without coordination and a node joining or leaving moves only its own
share of shards. A node that misses a shard it does not prefer fetches it from the preferred node
(the ``shard`` action: the bytes of a catalog shard, which that node fetches from the object
store once, into its own cache) instead of from the object store; if that node fails, from the
object store. So a whole epoch over n nodes downloads each shard from S3 about once, not n times.

Order and exactly-once are untouched: which node's cache holds the bytes never changes what a
ticket's rows are (the cache checks sizes, and a manifest's sha256, either way).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

import pyarrow.flight as flight

from flightfeed.server.cluster.node import Cluster
from flightfeed.server.data.catalog import Catalog
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.wire.errors import InvalidRequest

__all__ = ["rendezvous", "ShardRouter", "serve_shard", "CHUNK_BYTES"]

log = logging.getLogger("flightfeed.server")

CHUNK_BYTES = 4 << 20
Fetch = Callable[[str], "str | None"]


def rendezvous(key: str, nodes: Sequence[str]) -> str:
    """The node of ``nodes`` that ``key`` prefers (highest-random-weight hashing)."""
    return max(nodes, key=lambda n: hashlib.sha256(f"{n}\0{key}".encode()).digest())


class ShardRouter:
    """Routes this node's shard downloads through their preferred nodes; counts the bytes."""

    def __init__(
        self, cluster: Cluster, *, route: bool = True, token: str | None = None, tls_root_certs: bytes | None = None
    ) -> None:
        self.cluster = cluster
        self.route = route  # False: only count (every shard from storage, as without peers)
        headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(headers=headers)
        self._roots = tls_root_certs
        self._lock = threading.Lock()
        self._clients: dict[str, flight.FlightClient] = {}
        self.counts = {"s3_bytes": 0, "peer_bytes": 0, "s3_fetches": 0, "peer_fetches": 0, "peer_failures": 0}

    def install(self, catalog: Catalog) -> int:
        """Reroute every remote shard of ``catalog``; returns how many."""
        n = 0
        for ds in catalog.datasets():
            for shard in ds.shards:
                if isinstance(shard, RemoteShard):
                    direct = self._counted(shard._direct)
                    shard.reroute(self._routed(ds.name, shard.uri, direct), direct)
                    n += 1
        return n

    def preferred(self, uri: str) -> str:
        return rendezvous(uri, [node[0] for node in self.cluster.nodes()])

    def describe(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def _add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self.counts[k] += v

    def _counted(self, fetch: Fetch) -> Fetch:
        def direct(tmp: str) -> str | None:
            digest = fetch(tmp)
            self._add(s3_bytes=os.path.getsize(tmp), s3_fetches=1)
            return digest

        return direct

    def _routed(self, dataset: str, uri: str, direct: Fetch) -> Fetch:
        def routed(tmp: str) -> str | None:
            owner = self.preferred(uri) if self.route else self.cluster.entry()
            if owner != self.cluster.entry():
                try:
                    got = self._from_peer(owner, dataset, uri, tmp)
                    self._add(peer_bytes=got, peer_fetches=1)
                    return None  # the cache hashes (and checks) the bytes
                except Exception as exc:  # any failure: the object store still has it
                    self._add(peer_failures=1)
                    log.warning("shard %s: its preferred node %s failed (%s); fetching from storage", uri, owner, exc)
            return direct(tmp)

        return routed

    def _client(self, owner: str) -> flight.FlightClient:
        with self._lock:
            c = self._clients.get(owner)
            if c is None:
                kwargs: dict[str, Any] = {"tls_root_certs": self._roots} if self._roots else {}
                c = self._clients[owner] = flight.FlightClient(owner, **kwargs)
            return c

    def _from_peer(self, owner: str, dataset: str, uri: str, tmp: str) -> int:
        body = json.dumps({"dataset": dataset, "uri": uri}).encode()
        got = 0
        try:
            with open(tmp, "wb") as out:
                for result in self._client(owner).do_action(flight.Action("shard", body), self._options):
                    buf = result.body
                    out.write(memoryview(buf))
                    got += buf.size
        except Exception:
            with self._lock:
                c = self._clients.pop(owner, None)
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
            raise
        return got

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()


def serve_shard(catalog: Catalog, body: bytes) -> Iterator[bytes]:
    """The ``shard`` action: the bytes of one remote shard of the catalog (a peer's cache miss).
    Only shards of served datasets, named by their URI, are answered."""
    try:
        req = json.loads(body or b"{}")
        dataset, uri = str(req["dataset"]), str(req["uri"])
    except (ValueError, KeyError, TypeError):
        raise InvalidRequest(
            'shard action: the body must be JSON {"dataset": NAME, "uri": SHARD_URI}', field="body"
        ) from None
    ds = catalog.get(dataset)
    shard = next((s for s in ds.shards if isinstance(s, RemoteShard) and s.uri == uri), None)
    if shard is None:
        raise InvalidRequest(f"shard action: dataset {dataset!r} has no remote shard {uri[:200]!r}", field="uri")
    lease, file = shard.direct_file()  # pinned while it is sent; fetched from storage on a miss
    return _chunks(lease, file)


def _chunks(lease: Any, file: BinaryIO) -> Iterator[bytes]:
    try:
        with file as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk
    finally:
        lease.release()
