"""Pure placement: which locations serve endpoint k of a FlightInfo.

The live data nodes are a sorted list; each node is a list of its serving processes (its entry
location first, then its ``--workers`` processes). Endpoint ``k`` is served first by node
``k mod n`` (so streams rotate over the nodes), on that node's process ``(k // n) mod p`` (so they
rotate over its processes too); its alternate locations are the entry locations of the other live
nodes in rotation order, then its own node's entry location when the first choice is a worker.
A client that loses a location continues on the next one.

With a ``key`` (the request's job digest, ``request.identity``: the same for every rank and
epoch of one job), the nodes are first ranked by rendezvous hashing on (key, node): identical
requests (the trainers of a sweep or an ensemble) rank them alike, so their endpoint ``k`` lands
on the same process whichever node answered, and that process's window serves them all (shared
jobs); other jobs start their rotation at other nodes (and a node's processes at a key-chosen
one). A node joining or leaving moves only the jobs whose ranking it tops.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from urllib.parse import urlparse, urlunparse

__all__ = ["spread", "with_host", "is_wildcard", "host_of"]

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
