"""Pure placement: which locations serve endpoint k of a FlightInfo.

The live data nodes are a sorted list; each node is a list of its serving processes (its entry
location first, then its ``--workers`` processes). Endpoint ``k`` is served first by node
``k mod n`` (so streams rotate over the nodes), on that node's process ``(k // n) mod p`` (so they
rotate over its processes too); its alternate locations are the entry locations of the other live
nodes in rotation order, then its own node's entry location when the first choice is a worker.
A client that loses a location continues on the next one.

``k`` is a *slot*, not a stream index: :func:`first_slot` numbers every stream of a job (all
ranks, DataLoader workers and epochs) one after another, from a stable hash of the dataset and
seed, so R ranks x K streams land on R*K consecutive nodes (every node gets work when R*K >= the
node count; the first stream of every rank does not pile onto one node) and each epoch continues
the rotation where the last one ended. Every node computes the same slots (the sorted live node
list and the request fields are all it uses), so ranks asking different nodes still spread.

With a ``key`` (the request's job digest, ``request.identity``: the same for every rank and
epoch of one job), the slots rotate over the nodes ranked by rendezvous hashing on (key, node)
instead of their sorted order: identical requests (the trainers of a sweep or an ensemble) get
the same slots and the same ranking, so their endpoint ``k`` lands on the same process whichever
node answered, and that process's window serves them all (shared jobs); other jobs (other
columns or transforms with the same dataset and seed) rotate over other orders (and a node's
processes from a key-chosen one). A node joining or leaving moves only the jobs whose ranking it
tops.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from urllib.parse import urlparse, urlunparse

__all__ = ["spread", "first_slot", "with_host", "is_wildcard", "host_of"]

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def spread(nodes: Sequence[Sequence[str]], k: int, key: bytes = b"") -> list[str]:
    """The locations of endpoint ``k`` (first choice first) over ``nodes`` (ranked by rendezvous
    on ``key`` when one is given); [] when there are none."""
    live = [list(n) for n in nodes if n]
    if not live:
        return []
    start = 0
    if key:
        live.sort(key=lambda n: _score(key, n[0]), reverse=True)
        start = _score(key, "")  # and a node's processes from a key-chosen one
    n = len(live)
    i = k % n
    own = live[i]
    first = own[(k // n + start) % len(own)]
    out = [first]
    out += [live[(i + j) % n][0] for j in range(1, n)]
    if first != own[0]:
        out.append(own[0])
    return out


def first_slot(
    dataset: str,
    *,
    seed: int = 0,
    epoch: int = 0,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    streams: int = 1,
) -> int:
    """The slot of stream 0 of one request (stream ``k`` takes slot ``first_slot(...) + k``): the
    job's streams numbered rank-major over ``world_size * num_workers * streams`` per epoch, after
    a stable (process-independent) hash of ``dataset`` and ``seed``."""
    per_epoch = max(1, world_size) * max(1, num_workers) * max(1, streams)
    base = zlib.crc32(f"{dataset}\0{seed}".encode())
    return base + epoch * per_epoch + (rank * max(1, num_workers) + worker) * max(1, streams)


def _score(key: bytes, entry: str) -> int:
    """The rendezvous weight of node ``entry`` for request ``key`` (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(key + b"\0" + entry.encode(), digest_size=8).digest(), "big")


def is_wildcard(location: str) -> bool:
    """True when ``location`` names a wildcard host (bound to every address: not dialable)."""
    return (urlparse(location).hostname or "") in _WILDCARDS


def host_of(location: str) -> str:
    parsed = urlparse(location)
    return parsed.netloc.rsplit(":", 1)[0] if parsed.port else parsed.netloc


def with_host(location: str, host: str) -> str:
    """``location`` with its host replaced by ``host`` (the port and scheme kept)."""
    parsed = urlparse(location)
    port = f":{parsed.port}" if parsed.port else ""
    return urlunparse(parsed._replace(netloc=host + port))
