"""How many data nodes the trainers need: ``flightfeed_nodes_wanted``, from their stall reports.

Inputs: every client's ``report`` (cumulative ``wait_s``, ``elapsed_s``, ``bytes_total``; the
figures over its reports of the last 20 s are its *recent* stall and throughput; ``nodes``: how
many data nodes its streams read from) and the number of live nodes of the tier. The rule
(:func:`decide`), per scaling decision, with ``n`` the nodes the clients read from:

* ``rate`` = the clients' bytes per second; ``demand`` = sum of ``rate_i / (1 - stall_i)``: what
  they would take if no trainer ever waited; the tier's ``stall`` = ``1 - rate / demand``.
* **Stalled** (``stall >= target``, default 5%): the tier is the bottleneck, so one node
  sustains ``rate / n`` (its *saturation* rate, remembered per node count). Work moves between
  nodes by their speed (the client's lanes), so ``k`` nodes deliver about ``k`` times that:
  ``wanted = max(n + 1, ceil(demand x (1 - target) / (rate / n)))`` -- enough to bring the stall
  under the target in one step where the scaling is linear.
  Cachew's guard (add a worker while throughput improves by more than 7%): when the last node
  added (``n - 1 -> n``, both stalled) raised the throughput by less than ``add_gain``, more
  nodes do not help (the trainer's network, storage or the trainer itself is the limit): the
  tier holds at ``n``.
* **Not stalled**, with a saturation rate ``c`` measured earlier: ``wanted = max(1,
  ceil(demand x (1 - remove_loss) / c))``, never above ``n`` -- Cachew's removal rule: nodes
  go while the predicted throughput loss stays under 3%. Without a measurement (the tier was
  never the bottleneck) it holds at ``n``.
* No recent reports: hold at ``n``.

Reports go to the node a client names first, so that node holds the figures; the tier's answer is
the maximum over its nodes (what the HorizontalPodAutoscaler's external metric reads,
``deploy/k8s/hpa.yaml``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily

__all__ = ["ScalingPolicy", "Decision", "decide", "NodesWanted", "WantedCollector"]

_MIN_BUSY = 0.05  # a trainer waiting 95% of the time counts as wanting 20x its rate, no more


@dataclass(frozen=True)
class ScalingPolicy:
    stall_target: float = 0.05  # bring the trainers' stall under this
    add_gain: float = 0.07  # Cachew: add while a node raises throughput by more than this
    remove_loss: float = 0.03  # Cachew: remove while the predicted loss stays under this
    stale_s: float = 30.0  # a client silent for longer than this is not counted
    window_s: float = 20.0  # a client's recent figures span its reports of about this long
    min_span_s: float = 10.0  # ... and at least this much of its reading (an epoch's first second
    # -- every stream waiting for its first message -- lowers the rate it measures)

    def __post_init__(self) -> None:
        for name in ("stall_target", "add_gain", "remove_loss"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} is {value}; it must lie in [0, 1)")


@dataclass(frozen=True)
class Decision:
    nodes: int  # live nodes now
    wanted: int
    reason: str
    stall: float = 0.0
    bytes_per_s: float = 0.0
    demand_bytes_per_s: float = 0.0
    node_bytes_per_s: float = 0.0  # one node's saturation rate (0: not measured yet)
    clients: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "nodes_wanted": self.wanted,
            "reason": self.reason,
            "stall": self.stall,
            "bytes_per_s": self.bytes_per_s,
            "demand_bytes_per_s": self.demand_bytes_per_s,
            "node_bytes_per_s": self.node_bytes_per_s,
            "clients": self.clients,
        }


def decide(
    nodes: int,
    recent: list[tuple[float, float, int]],
    saturated: Mapping[int, float],
    policy: ScalingPolicy = ScalingPolicy(),
) -> Decision:
    """The node count for clients' recent ``(bytes_per_s, stall, nodes they read from)`` with
    ``nodes`` live nodes; ``saturated``: the tier's throughput at each node count measured while
    it was the bottleneck. A client that has not picked up a new node yet (it does at its next
    epoch) counts with the nodes it reads from."""
    n = max(1, nodes)
    if not recent:
        return Decision(n, n, "no recent client reports: holding")
    rate = sum(b for b, _, _ in recent)
    demand = sum(b / max(_MIN_BUSY, 1.0 - s) for b, s, _ in recent)
    stall = 1.0 - rate / demand if demand > 0 else 0.0
    used = max(1, min(n, max(k or n for _, _, k in recent)))
    figures: dict[str, Any] = {
        "stall": stall, "bytes_per_s": rate, "demand_bytes_per_s": demand, "clients": len(recent),
    }
    if rate <= 0:
        return Decision(n, n, "clients report no throughput: holding", **figures)
    if stall >= policy.stall_target:
        per_node = rate / used
        before, now = saturated.get(used - 1), saturated.get(used)
        if before is not None and now is not None and now < before * (1.0 + policy.add_gain):
            gain = now / before - 1.0
            return Decision(
                n, used, f"stall {stall:.0%}, but node {used} added only {gain:+.0%} throughput "
                f"(< {policy.add_gain:.0%}): the limit is not the data tier; holding", node_bytes_per_s=per_node,
                **figures,
            )  # fmt: skip
        need = math.ceil(demand * (1.0 - policy.stall_target) / per_node - 1e-9)
        wanted = max(used + 1, need)
        return Decision(
            n, wanted, f"stall {stall:.0%} >= {policy.stall_target:.0%}: {wanted} nodes at "
            f"{per_node / 1e6:.1f} MB/s each cover {demand / 1e6:.1f} MB/s of demand", node_bytes_per_s=per_node,
            **figures,
        )  # fmt: skip
    capacity = max((r / k for k, r in saturated.items() if k > 0), default=0.0)
    if capacity <= 0:
        return Decision(n, n, f"stall {stall:.0%} < {policy.stall_target:.0%}; no saturation measured: holding",
                        **figures)
    wanted = min(n, max(1, math.ceil(demand * (1.0 - policy.remove_loss) / capacity - 1e-9)))
    verb = "removing nodes" if wanted < n else "holding"
    return Decision(
        n, wanted, f"stall {stall:.0%} < {policy.stall_target:.0%}: {wanted} nodes at {capacity / 1e6:.1f} MB/s "
        f"each lose < {policy.remove_loss:.0%} of {demand / 1e6:.1f} MB/s: {verb}", node_bytes_per_s=capacity,
        **figures,
    )  # fmt: skip


@dataclass(frozen=True)
class _Seen:
    """One report's cumulative figures."""

    at: float
    elapsed_s: float
    wait_s: float
    bytes_total: float
    nodes: int  # data nodes the client reads from (0: not said)


@dataclass
class NodesWanted:
    """Clients' recent figures and the decision at the tier's size.

    A client's recent figures are its totals over its reports of the last ``policy.window_s``
    seconds that name the node count of its newest one (a client that started reading from more
    nodes is judged on those only), once they cover ``policy.min_span_s`` seconds of its reading:
    one report interval alone is too noisy (an epoch's first messages, a burst from the read-ahead
    window). An orchestrator should still act on a stable value (the HPA's stabilization window)."""

    policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    clock: Callable[[], float] = time.monotonic
    _clients: dict[str, deque[_Seen]] = field(default_factory=dict, init=False)
    _saturated: dict[int, float] = field(default_factory=dict, init=False)  # node count -> bytes/s
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def report(self, fig: Mapping[str, Any], nodes: int) -> None:
        """A validated client report arrived while ``nodes`` nodes were live."""
        now = self.clock()
        seen = _Seen(now, float(fig["elapsed_s"]), float(fig["wait_s"]), float(fig["bytes_total"]),
                     int(fig.get("nodes") or 0))
        with self._lock:
            history = self._clients.setdefault(str(fig["client_id"]), deque())
            if history and (seen.elapsed_s < history[-1].elapsed_s or seen.bytes_total < history[-1].bytes_total):
                history.clear()  # a new reader under the same id: its counters started again
            history.append(seen)
            while len(history) > 2 and now - history[1].at >= self.policy.window_s:
                history.popleft()  # keep one report at or before the window's start
            decision = self._decide(nodes, now)
            if decision.stall >= self.policy.stall_target and decision.bytes_per_s > 0:
                counts = {r[2] or max(1, nodes) for h in self._clients.values() if (r := self._recent(h)) is not None}
                if len(counts) == 1:  # every client read from the same number of nodes
                    self._saturated[counts.pop()] = decision.bytes_per_s

    def decision(self, nodes: int) -> Decision:
        with self._lock:
            return self._decide(nodes, self.clock())

    def _recent(self, history: deque[_Seen]) -> tuple[float, float, int] | None:
        """``(bytes/s, stall, nodes)`` of a client over its window (totals: single report intervals
        are lumpy, a batch or two each)."""
        last = history[-1]
        base = next(h for h in history if h.nodes == last.nodes)
        span = last.elapsed_s - base.elapsed_s
        if span < self.policy.min_span_s:
            return None
        waited = min(span, max(0.0, last.wait_s - base.wait_s))
        return (last.bytes_total - base.bytes_total) / span, waited / span, last.nodes

    def _decide(self, nodes: int, now: float) -> Decision:
        for client in [c for c, h in self._clients.items() if now - h[-1].at > self.policy.stale_s]:
            del self._clients[client]
        recent = [r for h in self._clients.values() if (r := self._recent(h)) is not None]
        return decide(nodes, recent, self._saturated, self.policy)


class WantedCollector:
    """``flightfeed_nodes_wanted`` (gauge) at scrape time: ``nodes()`` gives the live node count."""

    def __init__(self, wanted: NodesWanted, nodes: Callable[[], int]) -> None:
        self._wanted, self._nodes = wanted, nodes

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter([self._family(None)])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return iter([self._family(self._wanted.decision(self._nodes()))])

    @staticmethod
    def _family(decision: Decision | None) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "flightfeed_nodes_wanted",
            "Data nodes that would bring the trainers' stall under the target (observe/scaling.py; "
            "the tier's answer is the max over its nodes)",
        )
        if decision is not None:
            family.add_metric([], float(decision.wanted))
        return family
