"""The service's tenant checks: which datasets a caller sees, may read, and for how long.

A refusal is ``PermissionDenied`` with one message whether the dataset exists or not (a tenant
must not learn which names exist), naming only what the caller asked for; each refusal writes one
audit line (tenant, dataset asked, peer address, call; never the token). docs/security.md.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from flightfeed.server.guards.tenants.fair import FairGate, RateLimit, Turn
from flightfeed.server.guards.tenants.figures import TenantFigures
from flightfeed.server.guards.tenants.ledger import TenantLedger
from flightfeed.server.guards.tenants.middleware import caller
from flightfeed.server.guards.tenants.registry import Grant, TenantRegistry
from flightfeed.wire.errors import PermissionDenied

__all__ = ["TenantAccess", "audit_log"]

audit_log = logging.getLogger("flightfeed.audit")
_SEEN = 4096  # shared messages remembered per tenant (the window holds fewer)
D = TypeVar("D")


class TenantAccess:
    def __init__(
        self,
        registry: TenantRegistry,
        figures: TenantFigures,
        gate: FairGate | None = None,
        ledger: TenantLedger | None = None,
    ) -> None:
        self.registry = registry
        self.figures = figures
        self.gate = gate
        #: the node's ledger (``--workers`` > 1): ``max_streams`` and ``max_bytes_per_s`` node-wide
        self.ledger = ledger
        self._buckets: dict[str, RateLimit] = {}
        #: waits out a tenant's ``max_bytes_per_s`` (tests give a fake)
        self.sleep: Callable[[float], None] = time.sleep
        self.clock: Callable[[], float] = time.monotonic
        #: whether a message is kept in the shared-jobs window (the service sets it)
        self.shared: Callable[[pa.RecordBatch], bool] = lambda _batch: False
        self._seen: dict[str, OrderedDict[int, None]] = {}

    def grant(self, context: Any) -> Grant | None:
        return caller(context)

    def refuse(self, grant: Grant, context: Any, call: str, dataset: str, why: str = "") -> PermissionDenied:
        """Count and audit a refusal; the error to raise."""
        self.figures.refused(grant.tenant.name)
        peer = context.peer() if context is not None else "?"
        audit_log.warning(
            "refused: tenant=%s call=%s dataset=%r peer=%s%s", grant.tenant.name, call, dataset[:200], peer,
            f" ({why})" if why else "",
        )
        return PermissionDenied(
            f"tenant {grant.tenant.name!r} may not read dataset {dataset[:200]!r} here (it is not among the "
            "tenant's datasets, or not served by this node): ask the operator to add it to the tenant"
        )

    def dataset(self, context: Any, name: str, call: str, get: Callable[[str], D], exists: Callable[[str], bool]) -> D:
        """``get(name)`` when the caller may read ``name``; the same refusal when it may not or when
        it does not exist (for the operator, or without tokens: ``get``'s own error)."""
        grant = caller(context)
        if grant is None or grant.tenant.operator:
            return get(name)
        if grant.tenant.may_read(name) and exists(name):
            return get(name)
        raise self.refuse(grant, context, call, name)

    def visible(self, context: Any, names: list[str]) -> list[str]:
        grant = caller(context)
        return names if grant is None else grant.tenant.visible(names)

    def operator_only(self, context: Any, call: str) -> None:
        """Refuse a node-internal call (a peer's shard fetch) to tenants."""
        grant = caller(context)
        if grant is not None and not grant.tenant.operator:
            self.figures.refused(grant.tenant.name)
            audit_log.warning("refused: tenant=%s call=%s peer=%s (operator only)", grant.tenant.name, call,
                              context.peer() if context is not None else "?")
            raise PermissionDenied(f"{call} is a call between data nodes: tenant {grant.tenant.name!r} may not make it")

    def check_streams(self, context: Any, asked: int, dataset: str) -> None:
        """Refuse a request for more streams than the tenant's ``max_streams``."""
        grant = caller(context)
        if grant is None:
            return
        limit = self.registry.current(grant).max_streams
        if limit is not None and asked > limit:
            self.figures.refused(grant.tenant.name)
            audit_log.warning("refused: tenant=%s call=get_flight_info dataset=%r streams=%d max_streams=%d",
                              grant.tenant.name, dataset[:200], asked, limit)
            raise PermissionDenied(
                f"tenant {grant.tenant.name!r} may open at most {limit} streams (max_streams); "
                f"asked for {asked}: ask for fewer (ReadOptions(streams=...))"
            )

    def stream(self, context: Any, dataset: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` for the caller: counted against the tenant's ``max_streams``, each message made
        only while the tenant may still read ``dataset`` (a revoked token's stream ends with
        PermissionDenied at its next message), in turn through the fair gate."""
        grant = caller(context)
        if grant is None:
            return batches
        name = grant.tenant.name
        limit = self.registry.current(grant).max_streams
        here = self.figures.stream(name, +1)
        if self.ledger is not None:
            over = not self.ledger.open_stream(name, limit)
        else:
            over = here > (limit if limit is not None else 1 << 62)
        if over:
            self.figures.stream(name, -1)
            self.figures.refused(name)
            audit_log.warning("refused: tenant=%s call=do_get dataset=%r peer=%s (max_streams %s open)",
                              name, dataset[:200], context.peer() if context is not None else "?", limit)
            raise PermissionDenied(
                f"tenant {name!r} already has {limit} streams open here (max_streams): "
                "close some, or ask for fewer streams (ReadOptions(streams=...))"
            )
        return self._checked(grant, context, dataset, batches)

    def _cost(self, tenant: str, batch: pa.RecordBatch) -> int:
        """What the fair queue charges for ``batch``: its bytes, once per tenant for a message of
        the shared-jobs window (made once, sent to several of the tenant's streams)."""
        if not self.shared(batch):
            return int(batch.nbytes)
        seen = self._seen.setdefault(tenant, OrderedDict())
        if id(batch) in seen:
            seen.move_to_end(id(batch))
            return 0
        seen[id(batch)] = None
        if len(seen) > _SEEN:
            seen.popitem(last=False)
        return int(batch.nbytes)

    def _bucket(self, tenant: str, rate: int) -> RateLimit:
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.rate != rate:
            bucket = self._buckets[tenant] = RateLimit(rate, clock=self.clock)
        return bucket

    def _debt(self, tenant: str, nbytes: int, rate: int) -> float:
        """The wait ``max_bytes_per_s`` asks for: from the node's bucket (ledger) or this process's."""
        if self.ledger is not None:
            return self.ledger.debt(tenant, nbytes, rate)
        return self._bucket(tenant, rate).debt(nbytes)

    def _checked(
        self, grant: Grant, context: Any, dataset: str, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        name = grant.tenant.name
        gate = self.gate
        turn: Turn | None = None
        try:
            while True:
                self.registry.fresh()  # a change of the file since the last message takes effect now
                if not self.registry.allows(grant, dataset):
                    raise self.refuse(grant, context, "do_get", dataset, "token revoked or dataset withdrawn")
                tenant = self.registry.current(grant)
                if gate is not None:  # the previous turn (its message now written) passes to the next
                    turn = gate.acquire(name, tenant.weight) if turn is None else gate.renew(turn, tenant.weight)
                batch = next(batches, None)
                if batch is None:
                    return
                self.figures.sent(name, batch.num_rows, batch.nbytes)
                if tenant.max_bytes_per_s is not None:
                    self.sleep(self._debt(name, batch.nbytes, tenant.max_bytes_per_s))
                if turn is not None:
                    turn.cost = self._cost(name, batch)
                yield batch  # the turn spans the send: the writer asks for the next one once this is written
        finally:
            if gate is not None and turn is not None:
                gate.release(turn)
            self.figures.stream(name, -1)
            if self.ledger is not None:
                self.ledger.close_stream(name)
