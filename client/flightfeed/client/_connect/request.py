"""What a FlightDataset asks the server for: the ReadCommand of one iteration, and the stream
readers of the FlightInfo that answers it.

``read_command`` turns a :class:`ReadJob` (the dataset's settings), the topology (rank,
DataLoader worker) and the position to start from into a ReadCommand; ``open_readers`` sends it
to the first member of the tier that answers (:mod:`._dial`: a location that never answered is a
configuration error, an outage is retried under the budget of ``connect``), remembers the members
the endpoints name, and makes one :class:`StreamReader` per endpoint. An endpoint without
locations is served by the node that answered, then by the other members; an endpoint location on
a wildcard host (``grpc://0.0.0.0:PORT``: a node bound to every address) is dialled at the host of
the node that answered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow.flight as flight

from flightfeed.client._connect.boundary import flight_call
from flightfeed.client._connect.dial import first_answer
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._connect.streams import StreamReader
from flightfeed.client._options import ConnectOptions, ReadOptions
from flightfeed.client._state.state import ReadState
from flightfeed.client._state.topology import Topology
from flightfeed.client._tensors.pack import INPUTS, TARGETS, set_pack
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import INDEX_COLUMN, WIRE_VERSION, ReadCommand, StreamTicket
from flightfeed.wire.transforms import TransformSpec, defer_decode, set_transform

__all__ = ["ReadJob", "columns_arg", "read_command", "open_readers"]


@dataclass(frozen=True)
class ReadJob:
    """What one reader asks for, whatever its position: the dataset's settings."""

    name: str
    columns: list[str]
    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    transform: TransformSpec
    options: ReadOptions

    def settings(self) -> dict[str, Any]:
        """What a checkpoint of this job records and must match (``ReadState``; saved checkpoints
        are plain dicts of these keys)."""
        return {
            "dataset": self.name,
            "columns": self.columns,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "transform": json.loads(json.dumps(self.transform)),  # as a checkpoint stores it
            "pack": self.options.pack.as_dict() if self.options.pack is not None else None,
        }

    @property
    def tuple_columns(self) -> list[str]:
        """What ``as_tuple`` yields, in order: ``columns``, then ``row_index`` with ``with_index``;
        with ``Pack(targets="shifted")``: ``inputs, targets`` (``for x, y in ds``)."""
        if self.options.pack is not None and self.options.pack.targets == "shifted":
            return [INPUTS, TARGETS]
        return [*self.columns, INDEX_COLUMN] if self.options.with_index else self.columns


def columns_arg(columns: str | Sequence[str] | None) -> list[str]:
    """``columns`` as a list: a string names one column (not its characters)."""
    if columns is None:
        return []
    if isinstance(columns, str):
        return [columns]
    out = list(columns)
    bad = [c for c in out if not isinstance(c, str)]
    if bad:
        raise ConfigError(f"columns must be column names (strings); got {bad!r} in {columns!r}")
    return out


def read_command(job: ReadJob, topo: Topology, start: ReadState, epoch: int) -> Any:
    """The ReadCommand for ``job`` read by ``topo`` from ``start`` in ``epoch``."""
    opts = job.options
    cmd = ReadCommand(
        version=WIRE_VERSION,
        dataset=job.name,
        columns=job.columns,
        seed=job.seed,
        epoch=epoch,
        rank=topo.rank,
        world_size=topo.world_size,
        batch_rows=job.batch_size,
        drop_last=job.drop_last,
        streams=opts.streams,
        start_row=start.rows_consumed,
        global_start=start.global_start,
        worker=topo.worker,
        num_workers=topo.num_workers,
        fingerprint=start.fingerprint,
        compression=opts.compression or "",
        message_rows=_message_rows(job, topo, start),
        with_index=opts.with_index,
        views=True,  # shuffled messages' wide rows as views of the stored pages (docs/wire-views.md)
    )
    set_transform(cmd, job.transform, opts.on_decode_error)
    set_pack(cmd, opts.pack, job.columns)
    if opts.decode_on == "trainer":
        defer_decode(cmd)  # bytes + crop + flip: the trainer decodes (``_trainer_decode``)
    cmd.shuffle.enabled = job.shuffle
    cmd.shuffle.block_rows = start.block_rows or opts.block_rows
    cmd.shuffle.buffer_rows = start.buffer_rows or opts.buffer_rows
    return cmd


def _message_rows(job: ReadJob, topo: Topology, start: ReadState) -> int:
    """Rows per message: under DataLoader workers one batch (DataLoader takes one batch from each
    worker in turn, so only one-batch messages dealt round-robin to the workers keep the canonical
    order; ``ReadOptions(message_rows=...)`` applies without workers) or the grid a worker's
    checkpoint was read with; else ``ReadOptions(message_rows)`` (0: the server's choice)."""
    if topo.num_workers > 1:
        return start.message_rows if start.num_workers > 1 and start.message_rows else job.batch_size
    return job.options.message_rows


def open_readers(
    pool: ConnectionPool,
    cmd: Any,
    stop: threading.Event,
    *,
    members: Members,
    connect: ConnectOptions,
    prefetch: int,
    on_retry: Callable[[str, str], None] | None = None,
) -> list[StreamReader]:
    """get_flight_info for ``cmd`` at the first member that answers -> one (not yet started)
    StreamReader per endpoint."""
    descriptor = flight.FlightDescriptor.for_command(cmd.SerializeToString())
    options = connect.call_options()
    policy = connect.policy()
    answered: list[str] = []
    what = f"get_flight_info for dataset {cmd.dataset!r}"

    def get_info(entry: str) -> Any:
        try:
            with flight_call(f"{what} at {entry}"):
                info = pool.client(0, entry).get_flight_info(descriptor, options)
        except Exception:
            pool.discard(0, entry)  # reconnect next time (a restarted node, a name that resolves again)
            raise
        answered.append(entry)
        return info

    info = first_answer(get_info, members, policy, what=what, on_retry=on_retry)
    endpoints = [[_reachable(_uri(loc), answered[-1]) for loc in ep.locations] for ep in info.endpoints]
    members.listed(loc for locs in endpoints for loc in locs)
    home = [answered[-1], *(m for m in members.order() if m != answered[-1])]
    readers = []
    for k, (ep, found) in enumerate(zip(info.endpoints, endpoints, strict=True)):
        ticket = StreamTicket.FromString(ep.ticket.ticket)
        readers.append(
            StreamReader(
                pool, k, ticket, members.prefer(found) if found else home,
                depth=prefetch, policy=policy, stop=stop, on_retry=on_retry, members=members,
            )
        )
    return readers


def _uri(location: Any) -> str:
    return location.uri.decode() if isinstance(location.uri, bytes) else str(location.uri)


_WILDCARDS = ("0.0.0.0", "::", "")


def _reachable(location: str, asked: str) -> str:
    """``location`` with a wildcard host replaced by the host of ``asked`` (the location this client
    reached the node at). A node bound to ``0.0.0.0`` with no peers to learn its address from
    names its processes ``grpc://0.0.0.0:PORT``: dialled as is, that is the trainer's own host."""
    found, there = urlsplit(location), urlsplit(asked)
    try:
        port = found.port
    except ValueError:
        return location
    if found.hostname not in _WILDCARDS or port is None or not there.hostname or there.hostname in _WILDCARDS:
        return location
    host = f"[{there.hostname}]" if ":" in there.hostname else there.hostname
    return f"{found.scheme}://{host}:{port}"
