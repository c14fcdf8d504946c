"""The raw Flight ceiling: a minimal pyarrow Flight server for the shards of one directory.

``python bench/raw_flight.py DIR --message-rows M`` serves every ``*.arrow`` file of DIR (memory
mapped) and prints ``flight: grpc://127.0.0.1:PORT``. Ticket ``b"k/K"`` streams messages
``k, k+K, k+2K, ...`` of ``M`` rows each (stored order, zero-copy slices) with
``RecordBatchStream(RecordBatchReader.from_batches(...))``, so C++ encodes them without the GIL:
the same striping and message size as a flightfeed read with K streams, minus everything else.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc


class RawServer(flight.FlightServerBase):
    def __init__(self, directory: Path, message_rows: int, location: str = "grpc://127.0.0.1:0") -> None:
        super().__init__(location)
        tables = [ipc.open_file(pa.memory_map(str(p))).read_all() for p in sorted(directory.glob("*.arrow"))]
        self.table = pa.concat_tables(tables)
        self.message_rows = message_rows
        self.messages = [
            (lo, min(message_rows, self.table.num_rows - lo)) for lo in range(0, self.table.num_rows, message_rows)
        ]

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        k, n = (int(x) for x in ticket.ticket.decode().split("/"))
        batches = [b for lo, rows in self.messages[k::n] for b in self.table.slice(lo, rows).to_batches()]
        reader = pa.RecordBatchReader.from_batches(self.table.schema, iter(batches))
        return flight.RecordBatchStream(reader)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--message-rows", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = RawServer(args.directory, args.message_rows, f"grpc://127.0.0.1:{args.port}")
    print(f"flight: grpc://127.0.0.1:{server.port}", flush=True)
    signal.signal(signal.SIGINT, lambda *_: server.shutdown())
    signal.signal(signal.SIGTERM, lambda *_: server.shutdown())
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
