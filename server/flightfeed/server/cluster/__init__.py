"""Many data nodes behind one endpoint: membership, worker supervision, endpoint spread.

``peers`` keeps the membership (``--peers``, ``--peers-dns``, gossip), ``probe`` asks a peer's
health, ``node`` is this node's view of the tier, ``spread`` decides which process or node serves
each endpoint of a FlightInfo, ``locality`` routes cache misses to the node that owns a shard,
``workers`` supervises ``--workers`` processes and ``lifecycle`` drains a node on SIGTERM.
"""

from flightfeed.server.cluster.health_probe import HealthProbe
from flightfeed.server.cluster.node import Cluster
from flightfeed.server.cluster.peers import Membership, Peer, Resolver, parse_peers, parse_peers_dns, system_resolver
from flightfeed.server.cluster.spread import spread
from flightfeed.server.cluster.workers import READY_PREFIX, WorkerPool, default_workers

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
    "default_workers",
]
