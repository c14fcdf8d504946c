"""Many data nodes behind one endpoint: membership, worker supervision, endpoint spread."""

from flightfeed.server.cluster.node import Cluster
from flightfeed.server.cluster.peers import Membership, Peer, Resolver, parse_peers, parse_peers_dns, system_resolver
from flightfeed.server.cluster.probe import HealthProbe
from flightfeed.server.cluster.spread import spread
from flightfeed.server.cluster.workers import READY_PREFIX, WorkerPool

__all__ = [
    "Cluster",
    "Membership",
    "Peer",
    "Resolver",
    "parse_peers",
    "parse_peers_dns",
    "system_resolver",
    "HealthProbe",
    "spread",
    "READY_PREFIX",
    "WorkerPool",
]
