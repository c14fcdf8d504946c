"""This data node as the cluster sees it: its serving processes, its peers, its state.

One provider of *live locations* for ``get_flight_info``: this node's own processes (itself and
its live ``--workers``) and the live peers' processes, spread by :func:`.spread.spread`. While
draining (SIGTERM), the node leaves its own endpoints at once (when another node is live), its
plain ``health`` fails (so ``/readyz`` turns unready) and its peers see ``draining``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow.flight as flight
from prometheus_client.core import GaugeMetricFamily

from flightfeed.server.cluster.peers import Membership
from flightfeed.server.cluster.self_location import OwnLocations
from flightfeed.server.cluster.spread import host_of, is_wildcard, spread, with_host
from flightfeed.server.cluster.workers import WorkerPool

__all__ = ["Cluster"]


class Cluster:
    """``location``: this node's Flight location; ``datasets``: its {name: fingerprint}."""

    def __init__(
        self,
        location: str,
        datasets: Callable[[], dict[str, str]],
        *,
        workers: WorkerPool | None = None,
        membership: Membership | None = None,
    ) -> None:
        self.location = location
        self.datasets = datasets
        self.workers = workers
        self.membership = membership
        self.node_id = uuid.uuid4().hex
        #: which locations reach this process (a cluster proof is signed only for those)
        self.own = OwnLocations(lambda: self.location)
        self.locality: Any = None  # a locality.ShardRouter when shards are routed to preferred nodes
        self._draining = threading.Event()
        #: readiness checks: each returns why this node cannot serve well now (None: it can),
        #: e.g. the shard cache's disk is full; the plain health action (``/readyz``) says why
        self.checks: list[Callable[[], str | None]] = []

    # -- state ----------------------------------------------------------------------------
    def drain(self) -> None:
        """Stop offering this node (SIGTERM): unready, out of new FlightInfos."""
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def problems(self) -> list[str]:
        return [p for p in (check() for check in self.checks) if p]

    def status(self) -> str:
        if self.draining:
            return "draining"
        if self.workers is not None and not self.workers.all_live():
            return "degraded"
        if self.problems():
            return "degraded"
        return "ready"

    def entry(self) -> str:
        """This node's location as others reach it (a wildcard bind is replaced by the address
        a peer found us under, when one did)."""
        if is_wildcard(self.location) and self.membership is not None:
            mine = self.membership.self_addresses()
            if mine:
                return mine[0]
        return self.location

    def processes(self) -> list[str]:
        entry = self.entry()
        workers = self.workers.live() if self.workers is not None else []
        host = host_of(entry)
        return [entry] + [with_host(w, host) if is_wildcard(w) and not is_wildcard(entry) else w for w in workers]

    def nodes(self) -> list[list[str]]:
        """Every live node's processes (entry first), sorted by entry; this node left out while
        draining unless it is the only one."""
        peers = [p.processes for p in self.membership.live()] if self.membership is not None else []
        nodes = sorted((n for n in peers if n), key=lambda n: n[0])
        if not self.draining or not nodes:
            nodes = sorted([*nodes, self.processes()], key=lambda n: n[0])
        return nodes

    def endpoint_locations(self, k: int, key: bytes = b"") -> list[str]:
        """Locations of the endpoint in spread slot ``k`` (``spread.first_slot`` + its index) of
        the request whose job digest is ``key`` ([]: this server alone, the client's own location)."""
        nodes = self.nodes()
        if len(nodes) == 1 and len(nodes[0]) == 1 and nodes[0][0] == self.entry():
            return []
        return spread(nodes, k, key)

    # -- the health action ----------------------------------------------------------------
    def me(self) -> dict[str, Any]:
        """The fields this node sends with its own health requests (so a peer learns of it)."""
        return {"id": self.node_id, "node": self.entry()}

    def health(self, body: bytes) -> bytes:
        """Plain (empty body): ``b"ok"`` while ready, else an Unavailable error saying why.
        A JSON body asks for the detail (see ``probe``), answered in every state."""
        if body[:1] != b"{":
            status = self.status()
            if status != "ready":
                why = "it is draining (shutting down)" if status == "draining" else (
                    "; ".join(self.problems()) or "a worker process is down"
                )
                raise flight.FlightUnavailableError(f"node {self.entry()} is not ready: {why}")
            return b"ok"
        try:
            caller = json.loads(body)
        except ValueError:
            caller = {}
        if not isinstance(caller, dict):
            caller = {}
        membership = self.membership
        key = membership.key if membership is not None else None
        # a member's fresh challenge to this very process (not relayed, reflected or replayed);
        # this node checking itself (a --peers-dns name lists its own address) is one too
        admitted = key is not None and key.admits(caller, self.own.owns)
        if membership is not None and admitted and caller.get("id") != self.node_id:
            # only a node holding the cluster credential is learned, as a candidate this node
            # checks before it is live: a client's body is never enough
            membership.learn(str(caller.get("node", "")))
        peers = [p.location for p in membership.live()] if membership is not None else []
        detail: dict[str, Any] = {
            "id": self.node_id,
            "status": self.status(),
            "node": self.entry(),
            "processes": self.processes(),
            "peers": peers,
            "datasets": self.datasets(),
        }
        if key is not None and admitted:
            detail = key.sign_answer(caller, detail)
        return json.dumps(detail).encode()

    # -- reporting ------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The ``cluster`` section of ``/stats``."""
        peers = self.membership.describe() if self.membership is not None else []
        return {
            "node": self.entry(),
            "id": self.node_id,
            "status": self.status(),
            "processes": self.processes(),
            "nodes_live": len(self.nodes()),
            "peers_live": sum(1 for p in peers if p["state"] == "live"),
            "peers": peers,
            "workers": self.workers.describe() if self.workers is not None else [],
            "locality": self.locality.describe() if self.locality is not None else None,
        }

    def collector(self) -> _Collector:
        """A Prometheus collector of ``flightfeed_peers_live`` and ``flightfeed_workers_live``."""
        return _Collector(self)

    def start(self) -> None:
        if self.membership is not None:
            self.membership.start()

    def stop(self, grace: float = 0.0) -> None:
        if self.locality is not None:
            self.locality.close()
        if self.membership is not None:
            self.membership.stop()
        if self.workers is not None:
            self.workers.stop(grace)


class _Collector:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self.cluster
        live = len(c.membership.live()) if c.membership is not None else 0
        yield GaugeMetricFamily("flightfeed_peers_live", "Peer data nodes live (same data, answering)", value=live)
        workers = len(c.workers.live()) if c.workers is not None else 0
        yield GaugeMetricFamily("flightfeed_workers_live", "Worker processes of this node serving", value=workers)
