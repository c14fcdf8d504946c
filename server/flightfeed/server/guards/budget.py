"""A budget of bytes in flight: messages produced for gRPC and not yet taken by it.

A stream asks the budget for its next message's bytes *before* producing it (a shuffled message
is a fresh copy: producing it is what costs memory) and gives them back when gRPC asks for the
message after (it has then sent the previous one) or when the stream ends. Two soft limits
apply, one over the whole server and one per client (the peer's address): a message waits up
to ``wait_s`` for room under both. A wait can deadlock (a client reading streams in order leaves
a stream parked on a message while it waits for another stream that waits for room), so after
``wait_s`` a message may go over the soft limits, but never over the hard limit (``hard_factor``
x the overall limit): there it waits up to ``hard_wait_s`` and then fails with a retryable
StorageError ("server busy"). A message is never refused when nothing else is in flight, so a
single message larger than the limits still goes.

Every wait is counted by outcome (``ok``: room came; ``over``: went over the soft limits;
``busy``: refused) in ``flightfeed_bytes_in_flight_waits_total``; the bytes in flight per dataset
are the gauge ``flightfeed_bytes_in_flight``; :meth:`BytesInFlight.snapshot` is the ``/stats``
section ``bytes_in_flight``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.wire.errors import StorageError

__all__ = ["BytesInFlight", "metered", "peer_host", "DEFAULT_BYTES_IN_FLIGHT", "DEFAULT_CLIENT_BYTES_IN_FLIGHT"]

DEFAULT_BYTES_IN_FLIGHT = 512 << 20
DEFAULT_CLIENT_BYTES_IN_FLIGHT = 256 << 20


def peer_host(peer: str | bytes | None) -> str:
    """The client key of a gRPC peer string: ``ipv4:127.0.0.1:5000`` -> ``ipv4:127.0.0.1``."""
    text = peer.decode("utf-8", "replace") if isinstance(peer, bytes) else (peer or "")
    kind, _, rest = text.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        rest = rest.rsplit(":", 1)[0]
    return f"{kind}:{rest}" if rest else kind or "unknown"


class BytesInFlight:
    """The budget (see the module doc). ``limit``/``client_limit``: soft limits in bytes (0: none)."""

    def __init__(
        self,
        limit: int = DEFAULT_BYTES_IN_FLIGHT,
        client_limit: int = DEFAULT_CLIENT_BYTES_IN_FLIGHT,
        *,
        metrics: ServerMetrics | None = None,
        wait_s: float = 2.0,
        hard_factor: float = 2.0,
        hard_wait_s: float = 60.0,
    ) -> None:
        self.limit = max(0, limit)
        self.client_limit = max(0, client_limit)
        self.wait_s = wait_s
        self.hard_limit = int(self.limit * hard_factor)
        self.hard_wait_s = hard_wait_s
        self.metrics = metrics
        self._cond = threading.Condition()
        self.total = 0
        self.peak = 0
        self._clients: dict[str, int] = {}
        self._waits = {"ok": 0, "over": 0, "busy": 0}

    def _fits(self, client: str, n: int, soft: bool) -> bool:
        if self.total == 0:
            return True  # a lone message always goes (else one larger than the limit never would)
        if not soft:
            return not self.hard_limit or self.total + n <= self.hard_limit
        if self.limit and self.total + n > self.limit:
            return False
        held = self._clients.get(client, 0)
        return not (self.client_limit and held and held + n > self.client_limit)

    def acquire(self, client: str, dataset: str, n: int, *, wait: bool = True) -> None:
        """Take ``n`` bytes for ``client``, waiting as the module doc says (``wait=False``: at once)."""
        with self._cond:
            outcome = None
            if wait and not self._fits(client, n, soft=True):
                start = time.monotonic()
                soft_end, hard_end = start + self.wait_s, start + self.wait_s + self.hard_wait_s
                outcome = "ok"
                while not self._fits(client, n, soft=True):
                    now = time.monotonic()
                    if now >= soft_end and self._fits(client, n, soft=False):
                        outcome = "over"
                        break
                    if now >= hard_end:
                        self._count("busy")
                        raise StorageError(
                            f"server busy: {self.total / (1 << 20):.0f} MiB of messages in flight "
                            f"(limit {self.limit / (1 << 20):.0f} MiB, --max-bytes-in-flight); retry later"
                        )
                    self._cond.wait(min(0.25, max(0.001, (soft_end if now < soft_end else hard_end) - now)))
            self.total += n
            self.peak = max(self.peak, self.total)
            self._clients[client] = self._clients.get(client, 0) + n
            if outcome is not None:
                self._count(outcome)
        if self.metrics is not None:
            self.metrics.bytes_in_flight.labels(dataset).inc(n)

    def release(self, client: str, dataset: str, n: int) -> None:
        if n <= 0:
            return
        with self._cond:
            self.total -= n
            left = self._clients.get(client, 0) - n
            if left > 0:
                self._clients[client] = left
            else:
                self._clients.pop(client, None)
            self._cond.notify_all()
        if self.metrics is not None:
            self.metrics.bytes_in_flight.labels(dataset).dec(n)

    def _count(self, outcome: str) -> None:  # caller holds the lock
        self._waits[outcome] += 1
        if self.metrics is not None:
            self.metrics.in_flight_waits.labels(outcome).inc()

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return {
                "bytes": self.total,
                "peak_bytes": self.peak,
                "limit": self.limit,
                "client_limit": self.client_limit,
                "hard_limit": self.hard_limit,
                "clients": dict(sorted(self._clients.items(), key=lambda kv: -kv[1])[:20]),
                "waits": dict(self._waits),
            }


def metered(
    batches: Iterator[Any],
    budget: BytesInFlight,
    client: str,
    dataset: str,
    estimate: int,
    counted_elsewhere: Callable[[Any], bool] = lambda _batch: False,
) -> Generator[Any, None, None]:
    """``batches`` with each one's bytes held in ``budget`` from before it is produced (``estimate``
    bytes, then its real size) until the consumer asks for the next one or stops. A batch for which
    ``counted_elsewhere`` is true (kept in the shared-jobs window, which counts it) holds nothing
    once it exists."""
    held = 0
    try:
        while True:
            budget.acquire(client, dataset, estimate)
            held = estimate
            batch = next(batches, None)
            if batch is None:
                return
            size = 0 if counted_elsewhere(batch) else int(batch.nbytes)
            if size > held:
                budget.acquire(client, dataset, size - held, wait=False)  # it exists already
            else:
                budget.release(client, dataset, held - size)
            held = size
            yield batch
            budget.release(client, dataset, held)
            held = 0
    finally:
        budget.release(client, dataset, held)
