"""What a FlightDataset asks the server for: the ReadCommand of one iteration, and the stream
readers of the FlightInfo that answers it.

``read_command`` turns the dataset's settings, the topology (rank, DataLoader worker) and the
position to start from into a ReadCommand; ``open_readers`` sends it to the first of the
dataset's locations that answers (retried under the dataset's outage budget) and makes one
:class:`StreamReader` per endpoint. An endpoint without locations is served by the node that
answered, then by the other entries of ``location``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight

from flightfeed.client._boundary import flight_call
from flightfeed.client._pool import ConnectionPool
from flightfeed.client._retry import retrying, split_locations
from flightfeed.client._state import ReadState
from flightfeed.client._streams import StreamReader
from flightfeed.client._topology import Topology
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, StreamTicket
from flightfeed.wire.transforms import defer_decode, set_transform

if TYPE_CHECKING:
    from flightfeed.client._dataset import FlightDataset

__all__ = ["columns_arg", "read_command", "open_readers"]


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


def read_command(ds: FlightDataset, topo: Topology, start: ReadState, epoch: int) -> Any:
    """The ReadCommand for ``ds`` read by ``topo`` from ``start`` in ``epoch``."""
    cmd = ReadCommand(
        version=WIRE_VERSION,
        dataset=ds.name,
        columns=ds.columns,
        seed=ds.seed,
        epoch=epoch,
        rank=topo.rank,
        world_size=topo.world_size,
        batch_rows=ds.batch_size,
        drop_last=ds.drop_last,
        streams=ds.streams,
        start_row=start.rows_consumed,
        global_start=start.global_start,
        worker=topo.worker,
        num_workers=topo.num_workers,
        fingerprint=start.fingerprint,
        compression=ds.compression,
        message_rows=(start.message_rows if start.num_workers > 1 else 0) or ds.message_rows,
    )
    set_transform(cmd, ds.transform, ds.on_decode_error)
    if ds.decode_on == "trainer":
        defer_decode(cmd)  # bytes + crop + flip: the trainer decodes (``_trainer_decode``)
    cmd.shuffle.enabled = ds.shuffle
    cmd.shuffle.block_rows = start.block_rows or ds.block_rows
    cmd.shuffle.buffer_rows = start.buffer_rows or ds.buffer_rows
    return cmd


def open_readers(ds: FlightDataset, pool: ConnectionPool, cmd: Any, stop: threading.Event) -> list[StreamReader]:
    """get_flight_info for ``cmd`` -> one (not yet started) StreamReader per endpoint."""
    descriptor = flight.FlightDescriptor.for_command(cmd.SerializeToString())
    options = ds._connect.call_options()
    answered: list[str] = []

    def get_info(entry: str) -> Any:
        with flight_call(f"get_flight_info for dataset {ds.name!r} at {entry}"):
            info = pool.client(0, entry).get_flight_info(descriptor, options)
        answered.append(entry)
        return info

    entries = split_locations(ds.location)
    info = retrying(get_info, entries, ds.retry, what=f"get_flight_info for dataset {ds.name!r}", on_retry=ds._retried)
    home = [answered[-1], *(e for e in entries if e != answered[-1])]
    readers = []
    for k, ep in enumerate(info.endpoints):
        ticket = StreamTicket.FromString(ep.ticket.ticket)
        locations = [loc.uri.decode() if isinstance(loc.uri, bytes) else str(loc.uri) for loc in ep.locations]
        readers.append(
            StreamReader(
                pool, k, ticket, locations or home,
                depth=ds.prefetch, policy=ds.retry, stop=stop, on_retry=ds._retried,
            )
        )
    return readers
