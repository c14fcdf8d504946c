"""The Flight service: list_flights, get_flight_info (one endpoint per stream), get_schema, do_get;
its actions (stats, report, health, shard) are ``request/actions``. Every handler goes through
the error boundary (``guards/boundary``); with tenants, every call is checked (docs/security.md)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import repeat
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.server.cluster import Cluster
from flightfeed.server.cluster.spread import first_slot
from flightfeed.server.data.catalog import Catalog, Dataset
from flightfeed.server.data.readahead import ReadAhead
from flightfeed.server.guards.boundary import flight_errors, guarded_stream, schema_errors
from flightfeed.server.guards.budget import BytesInFlight, metered, peer_host
from flightfeed.server.guards.limits import Limits, check_read, check_ticket
from flightfeed.server.guards.listen import grpc_log, release, start_failure
from flightfeed.server.guards.tenants.access import TenantAccess
from flightfeed.server.guards.tenants.fair import FAIR_MAX_HOLD_S, FairGate
from flightfeed.server.guards.tenants.figures import TenantFigures
from flightfeed.server.guards.tenants.ledger import TenantLedger
from flightfeed.server.guards.tenants.middleware import MIDDLEWARE_KEY, TenantAuthFactory
from flightfeed.server.guards.tenants.node_queue import NodeQueue
from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.guards.tenants.table import TenantTable, operator_tenant
from flightfeed.server.observe.chunk_stats import install_chunk_stats
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.shared import shared_snapshot
from flightfeed.server.request.actions import ACTIONS, run_action
from flightfeed.server.request.packed import packed_row_bytes, packed_schema
from flightfeed.server.request.request_identity import job_digest
from flightfeed.server.request.shared_messages import DEFAULT_SHARE_WINDOW, ShareWindow
from flightfeed.server.request.streaming import (
    StreamSettings,
    check_columns,
    check_index,
    make_tickets,
    message_row_bytes,
    stored_order_tickets,
    ticket_batches,
    transform_plan,
    with_index_field,
)
from flightfeed.server.request.view_rows import to_wire, views_wanted
from flightfeed.server.transforms import SKIP_KEY, Transformer
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import decode_command, decode_ticket
from flightfeed.wire.views import wire_schema

__all__ = ["FlightFeedServer"]

log = logging.getLogger("flightfeed.server")


class FlightFeedServer(flight.FlightServerBase):
    """Serves the datasets of ``catalog``. Listens as soon as it is constructed (port 0: any)."""

    def __init__(
        self,
        catalog: Catalog,
        location: str = "grpc://127.0.0.1:0",
        *,
        metrics: ServerMetrics | None = None,
        settings: StreamSettings | None = None,
        tls_certificates: Sequence[tuple[bytes, bytes]] | None = None,
        auth_token: str | None = None,
        transformer: Transformer | None = None,
        limits: Limits | None = None,
        bytes_in_flight: BytesInFlight | None = None,
        share_window: int = DEFAULT_SHARE_WINDOW,
        tenants: TenantRegistry | None = None,
        fair_slots: int | None = None,
        ledger: TenantLedger | None = None,
    ) -> None:
        shared_tier = tenants is not None  # tenants from a file: fair queueing between them
        if tenants is None and auth_token is not None:  # one token: the operator, every dataset
            tenants = TenantRegistry(TenantTable({}, "--auth-token-file"), operator=operator_tenant(auth_token))
        middleware: dict[str, flight.ServerMiddlewareFactory] | None = (
            {MIDDLEWARE_KEY: TenantAuthFactory(tenants)} if tenants is not None else None
        )
        certs: Any = list(tls_certificates or [])
        try:
            with grpc_log() as captured:  # gRPC's absl lines about a failed bind stay off the terminal
                super().__init__(location, tls_certificates=certs, middleware=middleware)
        except pa.ArrowException as exc:
            if "did not start" not in str(exc):
                release(captured)
                raise
            raise start_failure(location, captured.text, tls=bool(certs)) from None
        release(captured)
        self.catalog = catalog
        self.metrics = metrics or ServerMetrics()
        #: who may read what (docs/security.md); figures per tenant in /metrics and /stats
        self.tenants = tenants
        figures = TenantFigures(self.metrics.registry)
        gate: FairGate | None = None
        if not shared_tier:
            ledger = None  # (the ledger shares tenants' limits; without a tenants file there are none)
        if shared_tier and fair_slots:  # virtual times of this process, or of the node (a shared ledger)
            queue = NodeQueue(ledger, fair_slots, max_hold=FAIR_MAX_HOLD_S) if ledger else None
            gate = FairGate(fair_slots, max_hold=FAIR_MAX_HOLD_S, queue=queue)
        self.access = TenantAccess(tenants or TenantRegistry(TenantTable({})), figures, gate, ledger)
        self.metrics.sections["tenants"] = lambda: figures.snapshot(tenants=list(self.access.registry.table.tenants))
        #: runs the transform steps clients name (``--decode-workers`` threads)
        self.transformer = transformer or Transformer(metrics=self.metrics)
        # one message size: the settings' (the target) is also the limits' (the cap)
        if settings is None:
            settings = StreamSettings(message_bytes=limits.message_bytes) if limits else StreamSettings()
        self.settings = settings
        self.limits = replace(limits or Limits(), message_bytes=settings.message_bytes)
        self.bytes_in_flight = bytes_in_flight or BytesInFlight(metrics=self.metrics)
        self.bytes_in_flight.metrics = self.metrics
        self.metrics.sections["bytes_in_flight"] = self.bytes_in_flight.snapshot
        #: shared jobs: messages made once for identical requests (``--share-window`` bytes; 0: off)
        self.share_window = ShareWindow(share_window, self.metrics.shared)
        self.access.shared = self.share_window.holds  # a shared message counts once per tenant (fair queue)
        self.metrics.sections["shared"] = self._shared_section
        install_chunk_stats(self.metrics, catalog)  # flightfeed_chunk_decodes_total, /stats chunk_cache
        for ds in catalog.datasets():  # a shard changed in place while served: count it
            ds.on_change(lambda d, _reason: self.metrics.io.shard_changes.labels(d.name).inc())
            if self.settings.readahead_windows > 0 and ds.readahead is None:
                ds.readahead = ReadAhead(ds, self.metrics.io, windows=self.settings.readahead_windows)
        parsed = urlparse(location)
        host = parsed.hostname or "127.0.0.1"
        scheme = parsed.scheme or "grpc"
        self.location = f"{scheme}://{host}:{self.port}"
        #: where streams go: this process, its workers and the live peer nodes (``cluster``)
        self.cluster = Cluster(self.location, self._fingerprints)
        caches = {  # (whole shards' cache; the block cache of shards read by range, ``storage/ranges``)
            id(c): c
            for ds in catalog.datasets()
            for s in ds.shards
            if (c := getattr(s, "cache", None) or getattr(s, "block_cache", None))
        }
        for cache in caches.values():  # a full cache disk makes the node unready, saying why
            self.cluster.checks.append(functools.partial(getattr, cache, "problem"))
        self.metrics.sections["cluster"] = self.cluster.describe
        self.metrics.registry.register(self.cluster.collector())
        self.metrics.nodes_live = lambda: len(self.cluster.nodes())  # for flightfeed_nodes_wanted

    def _shared_section(self) -> dict[str, Any]:
        return {**shared_snapshot(self.metrics.shared), **self.share_window.describe()}

    def _fingerprints(self) -> dict[str, str]:
        return {d.name: d.fingerprint for d in self.catalog.datasets()}

    # -- discovery ------------------------------------------------------------------------
    def _schema(self, ds: Dataset, read: Any) -> pa.Schema:
        """The schema a command's streams carry: projected, with transformed columns' new types."""
        if read.HasField("pack"):
            return packed_schema(ds, read)
        schema = ds.project_schema(list(read.columns))
        plan = transform_plan(ds, read, self.transformer)
        check_index(ds, read)
        return with_index_field(plan.schema(schema) if plan is not None else schema, read)

    def _info(
        self, ds: Dataset, descriptor: flight.FlightDescriptor, tickets: list[Any], schema: pa.Schema, first: int
    ) -> Any:
        """``first``: the spread slot of endpoint 0 (``cluster.spread.first_slot``)."""
        endpoints = []
        # the ranks of one job rank the nodes alike: identical requests meet on one process (shared jobs)
        key = job_digest(ds, tickets[0].read) if tickets else b""
        for k, t in enumerate(tickets):
            locs: list[str | flight.Location] = [
                flight.Location(u) for u in self.cluster.endpoint_locations(first + k, key)
            ]
            endpoints.append(flight.FlightEndpoint(t.SerializeToString(), locs))
        rows = sum(int(t.expected_rows) for t in tickets)
        return flight.FlightInfo(schema, descriptor, endpoints, total_records=rows, total_bytes=-1, ordered=True)

    def _dataset(self, context: Any, name: str, call: str) -> Dataset:
        """The dataset ``name`` if the caller may read it (else PermissionDenied, see guards/tenants)."""
        return self.access.dataset(context, name, call, self.catalog.get, lambda n: n in self.catalog.names())

    @flight_errors
    def list_flights(self, context: Any, criteria: Any) -> Iterator[Any]:
        visible = set(self.access.visible(context, self.catalog.names()))
        for ds in self.catalog.datasets():
            if ds.name not in visible:
                continue
            yield flight.FlightInfo(
                ds.schema,
                flight.FlightDescriptor.for_path(ds.name),
                [],
                total_records=ds.num_rows,
                total_bytes=ds.nbytes,
            )

    @flight_errors
    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> Any:
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            ds = self._dataset(context, self._path_name(descriptor), "get_flight_info")
            return self._info(ds, descriptor, stored_order_tickets(ds, self.settings), ds.schema, first_slot(ds.name))
        cmd = decode_command(descriptor.command or b"")
        ds = self._dataset(context, cmd.dataset, "get_flight_info")
        self.access.check_streams(context, int(cmd.streams), ds.name)
        check_columns(ds, list(cmd.columns))
        check_read(ds, cmd, self.limits, self._row_bytes(ds, cmd))
        tickets = make_tickets(ds, cmd, self.settings, self.transformer, nodes=len(self.cluster.nodes()))
        first = first_slot(
            ds.name, seed=cmd.seed, epoch=cmd.epoch, rank=cmd.rank, world_size=cmd.world_size,
            worker=cmd.worker, num_workers=cmd.num_workers, streams=cmd.streams,
        )
        return self._info(ds, descriptor, tickets, self._schema(ds, cmd), first)

    def _row_bytes(self, ds: Dataset, read: Any) -> int:
        """Bytes of one row as sent (after the request's transforms): what message sizes count."""
        if read.HasField("pack"):
            return packed_row_bytes(ds, read)
        return message_row_bytes(ds, list(read.columns), transform_plan(ds, read, self.transformer))

    @schema_errors
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> Any:
        if descriptor.descriptor_type == flight.DescriptorType.PATH:
            return flight.SchemaResult(self._dataset(context, self._path_name(descriptor), "get_schema").schema)
        cmd = decode_command(descriptor.command or b"")
        ds = self._dataset(context, cmd.dataset, "get_schema")
        check_columns(ds, list(cmd.columns))
        return flight.SchemaResult(self._schema(ds, cmd))

    def _path_name(self, descriptor: flight.FlightDescriptor) -> str:
        path = descriptor.path or []
        if len(path) != 1:
            raise InvalidRequest(
                f"path descriptor must have one element (the dataset name), got {len(path)}",
                field="descriptor.path",
            )
        return str(path[0].decode("utf-8", "replace"))

    # -- data -----------------------------------------------------------------------------
    @flight_errors
    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        t, schema, counted = self.open_ticket(context, ticket)
        options = pa.ipc.IpcWriteOptions(compression=t.read.compression or None)
        if t.read.on_decode_error == "skip" and (t.read.transform or t.read.transforms):
            # skipped rows travel as app_metadata: GeneratorStream can attach it per RecordBatch
            return flight.GeneratorStream(schema, _with_skip_metadata(counted, schema), options=options)
        reader = pa.RecordBatchReader.from_batches(schema, counted)
        return flight.RecordBatchStream(reader, options=options)

    @flight_errors
    def open_ticket(self, context: Any, ticket: flight.Ticket) -> tuple[Any, pa.Schema, Iterator[pa.RecordBatch]]:
        """A checked ticket, its schema and its (counted, metered, error-guarded) RecordBatches:
        what ``do_get`` streams. Validation errors are raised here, before the stream starts."""
        t = decode_ticket(ticket.ticket)
        ds = self._dataset(context, t.read.dataset, "do_get")
        check_columns(ds, list(t.read.columns))
        row_bytes = self._row_bytes(ds, t.read)
        check_ticket(ds, t, self.limits, row_bytes, int(t.num_rows) if t.read.HasField("pack") else None)
        client = peer_host(context.peer() if context is not None else None)
        made = ticket_batches(ds, t, self.transformer, self.share_window)
        schema = self._schema(ds, t.read)
        if views_wanted(t.read):  # the reader takes view columns (docs/wire-views.md)
            schema = wire_schema(schema)
            made = map(to_wire, made, repeat(schema))
        made = self.access.stream(context, ds.name, made)
        batches = metered(
            made, self.bytes_in_flight, client, ds.name, t.message_rows * row_bytes, self.share_window.holds
        )
        first = next(batches, None)  # validation errors surface before the stream starts
        return t, schema, self._counted(ds.name, first, batches)

    def _counted(
        self, name: str, first: pa.RecordBatch | None, rest: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        self.metrics.stream_started(name)
        outcome = "error"
        try:
            if first is not None:
                self.metrics.batch_sent(name, first.num_rows, first.nbytes)
                yield first
            for batch in guarded_stream(rest):
                self.metrics.batch_sent(name, batch.num_rows, batch.nbytes)
                yield batch
            outcome = "ok"
        except GeneratorExit:
            outcome = "cancelled"
            raise
        finally:
            self.metrics.stream_finished(name, outcome)

    # -- not served -----------------------------------------------------------------------
    @flight_errors
    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise InvalidRequest("this server is read-only: do_put is not supported; read with do_get", field="rpc")

    @flight_errors
    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise InvalidRequest(
            "do_exchange is not supported: ask get_flight_info for tickets and read them with do_get", field="rpc"
        )

    # -- actions --------------------------------------------------------------------------
    @flight_errors
    def list_actions(self, context: Any) -> Any:
        return list(ACTIONS.items())

    @flight_errors
    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        return run_action(self, context, action)


def _with_skip_metadata(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[Any]:
    """RecordBatches as (batch, app_metadata): a batch that lost rows sends its SkipInfo."""
    for batch in batches:
        meta = batch.schema.metadata or {}
        info = meta.get(SKIP_KEY)
        if info is None:
            yield batch
        else:
            yield batch.replace_schema_metadata(schema.metadata), pa.py_buffer(info)
