"""Whether a location names this very process: the check a node makes before it signs a proof.

A cluster proof is bound to the location the verifier dialled (``credential``): a node signs
only for a location that reaches *it*. Otherwise a non-member listed in some node's ``--peers``
could forward the verifier's challenge to a real member (a relay) or back to the verifier itself
(a reflection) and pass the real member's answer off as its own.

A location is this process's when its port is the port this process listens on and its host is
one of this machine's addresses: the bound address itself, or, for a wildcard bind
(``0.0.0.0``/``::``), any address of this host (one a socket can be bound to). Host names are
resolved (cached for ``ttl_s``), so ``grpc://flightfeed-1:8815`` inside its own container is its.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlparse

__all__ = ["OwnLocations", "resolve_host", "is_local_address"]

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def resolve_host(host: str) -> set[str]:
    """The addresses ``host`` resolves to (empty when it does not)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return set()
    return {str(info[4][0]) for info in infos}


def is_local_address(address: str) -> bool:
    """Whether ``address`` belongs to this host (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


class OwnLocations:
    """``owns(location)``: whether ``location`` reaches the process bound at ``bound()`` (a
    callable: a port-0 bind learns its port after start)."""

    def __init__(
        self,
        bound: Callable[[], str],
        *,
        resolver: Callable[[str], set[str]] = resolve_host,
        local: Callable[[str], bool] = is_local_address,
        ttl_s: float = 60.0,
    ) -> None:
        self._bound, self._resolver, self._local, self.ttl_s = bound, resolver, local, ttl_s
        self._cache: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def owns(self, location: str) -> bool:
        try:
            mine, theirs = urlparse(self._bound()), urlparse(location)
            my_port, their_port = mine.port, theirs.port
        except ValueError:
            return False
        if not theirs.hostname or their_port is None or their_port != my_port:
            return False
        now = time.monotonic()
        with self._lock:
            known = self._cache.get(location)
        if known is not None and now - known[0] < self.ttl_s:
            return known[1]
        answer = self._host_is_mine(mine.hostname or "", theirs.hostname)
        with self._lock:
            if len(self._cache) > 1024:
                self._cache.clear()
            self._cache[location] = (now, answer)
        return answer

    def _host_is_mine(self, bound_host: str, host: str) -> bool:
        addresses = self._resolver(host)
        if bound_host.strip("[]") in _WILDCARD_HOSTS:
            return any(self._local(a) for a in addresses)
        return bool(addresses & self._resolver(bound_host))
