"""``ds.info()`` / ``ds.classes``: what the server says about a dataset (schema, rows, classes).

Class names travel in the schema metadata as ``flightfeed.classes`` (a JSON list; written by
``flightfeed convert`` for image folders): label ``i`` is ``classes[i]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.client._boundary import flight_call
from flightfeed.client._options import ConnectOptions
from flightfeed.client._pool import ConnectionPool
from flightfeed.wire.classes import classes_of

__all__ = ["dataset_info"]

def dataset_info(pool: ConnectionPool, connect: ConnectOptions, name: str, columns: Sequence[str]) -> dict[str, Any]:
    """``name``, ``rows``, ``columns`` (name -> Arrow type as text), ``classes`` and ``schema``."""
    with flight_call(f"get_flight_info for dataset {name!r} at {pool.location}"):
        info = pool.client(0).get_flight_info(flight.FlightDescriptor.for_path(name), connect.call_options())
    schema: pa.Schema = info.schema
    if columns:
        schema = pa.schema([schema.field(c) for c in columns if c in schema.names], metadata=schema.metadata)  # type: ignore[arg-type]
    return {
        "name": name,
        "rows": int(info.total_records),
        "columns": {f.name: str(f.type) for f in schema},
        "classes": classes_of(schema),
        "schema": schema,
    }
