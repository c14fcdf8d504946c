"""Membership: the other data nodes, found statically or by DNS, health-checked, kept live.

Peers come from ``--peers grpc://a:8815,grpc://b:8815`` (static), from ``--peers-dns NAME:PORT``
(every address the name resolves to, re-resolved every ``refresh_s``: a Kubernetes headless
Service) and, only with a cluster credential (``key``, ``--cluster-token-file``), by gossip: a
node that checks us names itself, and every answer lists the peers the other node sees live.
With a key, every request and answer carries a proof of it (see ``credential``), bound to the
location dialled and to a nonce this node chose and accepts once: a request without one teaches
nothing, and a peer that cannot prove it *to this node* (not relayed from another member, not
reflected, not replayed) is ``down`` whatever it claims; a location learned by gossip is only a
candidate until it has proved itself here.
Without a key nothing is learned: the peers are the operator's lists. Each peer is asked for its
``health`` detail every ``interval`` s (with a timeout); its state is one of

- ``live``: ready (or degraded) and serving the same dataset versions as this node,
- ``draining``: shutting down; no longer offered,
- ``mismatch``: serves other data (a dataset's fingerprint differs or is missing); excluded
  and named in a warning,
- ``down``: does not answer; a learned peer down for ``forget_s`` is forgotten,
- ``self``: this very node, reached under that address,
- ``unknown``: not checked yet.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from flightfeed.server.cluster.credential import ClusterKey, NotAMember
from flightfeed.server.cluster.health_probe import HealthProbe
from flightfeed.server.cluster.spread import host_of, is_wildcard, with_host
from flightfeed.wire.errors import ConfigError

__all__ = ["Membership", "Peer", "Resolver", "system_resolver", "parse_peers", "parse_peers_dns"]

log = logging.getLogger("flightfeed.server")

#: (host, port) -> the addresses the name resolves to
Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (IPv6 in brackets), sorted, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out = {f"[{i[4][0]}]" if i[0] == socket.AF_INET6 else str(i[4][0]) for i in infos}
    return sorted(out)


def parse_peers(text: str) -> list[str]:
    """``grpc://a:8815,grpc://b:8815`` -> its locations (a clear ConfigError when malformed)."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        parsed = urlparse(item)
        if parsed.scheme not in ("grpc", "grpc+tcp", "grpc+tls") or not parsed.hostname or not parsed.port:
            raise ConfigError(f"--peers: {item!r} is not a Flight location; use grpc://HOST:PORT[,grpc://HOST:PORT...]")
        out.append(item)
    return out


def parse_peers_dns(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--peers-dns {text!r}: expected NAME:PORT, e.g. flightfeed-headless.ns.svc:8815")
    return host, int(port)


@dataclass
class Peer:
    location: str
    source: str  # static | dns | learned
    state: str = "unknown"
    id: str | None = None
    status: str | None = None  # the peer's own status (ready, degraded, draining)
    processes: list[str] = field(default_factory=list)
    last_check: float | None = None  # wall time
    last_ok: float | None = None
    error: str | None = None
    since: float = field(default_factory=time.time)  # when this node first heard of it

    def describe(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "source": self.source,
            "state": self.state,
            "status": self.status,
            "processes": list(self.processes),
            "last_check": self.last_check,
            "last_ok": self.last_ok,
            "error": self.error,
        }


class Membership:
    """The peers of one node. ``me()`` gives this node's detail request fields (``id``, ``node``)
    and ``datasets()`` its {name: fingerprint}; ``resolver`` is injectable (tests use a fake)."""

    def __init__(
        self,
        me: Callable[[], dict[str, Any]],
        datasets: Callable[[], dict[str, str]],
        *,
        static: Sequence[str] = (),
        dns: tuple[str, int] | None = None,
        scheme: str = "grpc",
        resolver: Resolver = system_resolver,
        interval: float = 1.0,
        timeout_s: float = 2.0,
        refresh_s: float = 10.0,
        forget_s: float = 60.0,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        key: ClusterKey | None = None,
    ) -> None:
        self._me, self._datasets = me, datasets
        #: the cluster credential (None: no gossip, the operator's lists only)
        self.key = key
        self.dns, self.scheme, self.resolver = dns, scheme, resolver
        self.interval, self.timeout_s, self.refresh_s, self.forget_s = interval, timeout_s, refresh_s, forget_s
        self._token, self._roots = token, tls_root_certs
        self._peers: dict[str, Peer] = {loc: Peer(loc, "static") for loc in static}
        self._probes: dict[str, HealthProbe] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resolved_at: float | None = None
        self._warned: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="flightfeed-peer")

    # -- views ----------------------------------------------------------------------------
    def live(self) -> list[Peer]:
        with self._lock:
            return [Peer(**vars(p)) for p in self._peers.values() if p.state == "live"]

    def self_addresses(self) -> list[str]:
        with self._lock:
            return sorted(p.location for p in self._peers.values() if p.state == "self")

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p.describe() for p in sorted(self._peers.values(), key=lambda p: p.location)]

    # -- changes --------------------------------------------------------------------------
    def learn(self, location: str) -> None:
        """A node that proved the cluster credential named itself, or a proven peer listed it:
        check it from now on. Without a credential nothing is learned."""
        if self.key is None or not location or is_wildcard(location) or location == self._me().get("node"):
            return
        with self._lock:
            if location not in self._peers:
                self._peers[location] = Peer(location, "learned")

    def _resolve(self) -> None:
        if self.dns is None:
            return
        now = time.monotonic()
        if self._resolved_at is not None and now - self._resolved_at < self.refresh_s:
            return
        self._resolved_at = now
        host, port = self.dns
        try:
            addresses = self.resolver(host, port)
        except OSError as exc:
            log.warning("--peers-dns %s:%d: cannot resolve (%s); keeping the last set", host, port, exc)
            return
        found = {f"{self.scheme}://{a}:{port}" for a in addresses}
        with self._lock:
            for loc in found:
                peer = self._peers.get(loc)
                if peer is None or peer.source == "learned":
                    self._peers[loc] = Peer(loc, "dns") if peer is None else Peer(**dict(vars(peer), source="dns"))
            for loc in [loc for loc, p in self._peers.items() if p.source == "dns" and loc not in found]:
                del self._peers[loc]  # the name no longer resolves to it (scaled down, rescheduled)

    # -- checking -------------------------------------------------------------------------
    def check_once(self) -> None:
        """Resolve (when due) and check every peer once, in parallel."""
        self._resolve()
        with self._lock:
            targets = [p.location for p in self._peers.values() if p.state != "self"]
        me = self._me()
        for loc, result in zip(targets, self._pool.map(lambda loc: self._check(loc, me), targets), strict=True):
            self._apply(loc, result)
        self._forget()

    def _probe(self, location: str) -> HealthProbe:
        with self._lock:
            probe = self._probes.get(location)
            if probe is None:
                probe = self._probes[location] = HealthProbe(
                    location, timeout_s=self.timeout_s, token=self._token, tls_root_certs=self._roots
                )
            return probe

    def _check(self, location: str, me: dict[str, Any]) -> dict[str, Any] | Exception:
        request = self.key.sign_request(me, to=location) if self.key is not None else me
        try:
            answer = self._probe(location).detail(request)
            if self.key is not None and not self.key.proves(request, answer):
                raise NotAMember(
                    f"{location} did not prove it belongs to this cluster (its --cluster-token-file is "
                    "missing or differs, or it passed on another node's answer); it is not offered"
                )
            return answer
        except Exception as exc:  # any failure: the peer is down for us
            return exc
        finally:
            if self.key is not None:
                self.key.forget(request)

    def _apply(self, location: str, result: dict[str, Any] | Exception) -> None:
        now = time.time()
        # asked before taking the lock: ``me`` may call back into this membership (a wildcard
        # bind's entry is one of ``self_addresses``), and the lock is not reentrant
        mine, my_id = self._datasets(), me_id(self._me())
        learned: list[str] = []
        with self._lock:
            peer = self._peers.get(location)
            if peer is None:
                return
            peer.last_check = now
            if isinstance(result, Exception):
                lines = str(result).strip().splitlines()
                peer.state, peer.error, peer.processes = "down", lines[0] if lines else type(result).__name__, []
                return
            peer.id, peer.status, peer.error = str(result["id"]), str(result["status"]), None
            peer.last_ok = now
            if peer.id == my_id:
                peer.state, peer.processes = "self", []
                return
            host = host_of(location)
            procs = [str(p) for p in result["processes"]]
            peer.processes = [location] + [with_host(p, host) if is_wildcard(p) else p for p in procs[1:]]
            differs = _differences(mine, {str(k): str(v) for k, v in dict(result["datasets"]).items()})
            if differs:
                peer.state = "mismatch"
                peer.error = f"serves other data: {differs}"
            else:
                peer.state = "draining" if peer.status == "draining" else "live"
            learned = [str(p) for p in result["peers"]]
        if differs and self._warned.get(location) != differs:
            log.warning("peer %s serves other data (%s); it is excluded from this node's endpoints", location, differs)
            self._warned[location] = differs
        for loc in learned:
            self.learn(loc)

    def _forget(self) -> None:
        now = time.time()
        with self._lock:
            for loc in [
                loc for loc, p in self._peers.items()
                if p.source == "learned" and p.state == "down" and now - (p.last_ok or p.since) > self.forget_s
            ]:
                del self._peers[loc]
                probe = self._probes.pop(loc, None)
                if probe is not None:
                    probe.close()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.check_once()
        self._thread = threading.Thread(target=self._loop, name="flightfeed-membership", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:  # a bug here must not end membership
                log.exception("membership check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
        self._pool.shutdown(wait=False)
        with self._lock:
            probes, self._probes = list(self._probes.values()), {}
        for p in probes:
            p.close()


def me_id(me: dict[str, Any]) -> str:
    return str(me.get("id", ""))


def _differences(mine: dict[str, str], theirs: dict[str, str]) -> str:
    """'' when both serve the same datasets at the same fingerprints, else what differs."""
    out = []
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if a == b:
            continue
        if a is None:
            out.append(f"dataset {name!r} is not served here")
        elif b is None:
            out.append(f"dataset {name!r} is missing there")
        else:
            out.append(f"dataset {name!r} has fingerprint {b[:12]} there, {a[:12]} here")
    return "; ".join(out)
