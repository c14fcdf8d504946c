"""``ds.info()`` / ``ds.classes``: what the server says about a dataset (schema, rows, classes).

Class names travel in the schema metadata as ``flightfeed.classes`` (a JSON list; written by
``flightfeed convert`` for image folders): label ``i`` is ``classes[i]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.client._connect.boundary import flight_call
from flightfeed.client._connect.dial import first_answer
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._options import ConnectOptions
from flightfeed.wire.classes import classes_of
from flightfeed.wire.errors import InvalidRequest

__all__ = ["dataset_info", "describe"]


def dataset_info(
    pool: ConnectionPool, members: Members, connect: ConnectOptions, name: str, columns: Sequence[str]
) -> dict[str, Any]:
    """``name``, ``rows``, ``columns`` (name -> Arrow type as text), ``classes`` and ``schema``; asked
    of the first member of the tier that answers (:mod:`._dial`)."""
    what = f"get_flight_info for dataset {name!r}"
    descriptor = flight.FlightDescriptor.for_path(name)

    def get_info(entry: str) -> Any:
        try:
            with flight_call(f"{what} at {entry}"):
                return pool.client(0, entry).get_flight_info(descriptor, connect.call_options())
        except Exception:
            pool.discard(0, entry)
            raise

    info = first_answer(get_info, members, connect.policy(), what=what)
    return describe(info.schema, int(info.total_records), name, columns)


def describe(schema: pa.Schema, rows: int, name: str, columns: Sequence[str]) -> dict[str, Any]:
    """The info dict of a dataset whose path FlightInfo said ``schema`` and ``rows``; a column of
    ``columns`` the dataset lacks fails naming it, as the read would (not an info without it)."""
    if columns:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise InvalidRequest(
                f"unknown column(s) {unknown} in dataset {name!r}; columns: {schema.names}", field="columns"
            )
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)  # type: ignore[arg-type]
    return {
        "name": name,
        "rows": rows,
        "columns": {f.name: str(f.type) for f in schema},
        "classes": classes_of(schema),
        "schema": schema,
    }
