"""Nulls met on the way from Arrow to torch: tensors cannot hold them.

The converters (``_tensors.arrow``) raise :class:`NullValues` where an array holds nulls; the
callers that know the column turn it into a :class:`~flightfeed.wire.errors.DatasetError` naming
it (``arrow.batch_to_torch`` for a column, ``ragged`` for a list column's items), with the words
of the null-list refusal: nothing is reshaped or served around a null.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["NullValues"]


class NullValues(ValueError):
    """An array to become a tensor holds ``count`` nulls, at the level of type ``at`` (a null row
    of a fixed-size list, or a null value)."""

    def __init__(self, count: int, at: pa.DataType) -> None:
        super().__init__(f"{count} null(s) of type {at}; tensors cannot hold nulls")
        self.count = count
        self.at = at
