"""A few bytes of each of a message's rows, taken from many chunks by one numpy call.

A shuffled message's rows lie in several chunks (memory-mapped record batches, decoded chunks):
separate buffers at addresses of their own. To take a small value of each row (a label or an id
column, or the first four bytes of a wide row, which its ``binary_view`` view must carry) numpy
needs either one call per chunk or the chunks joined first (a copy of every touched chunk's
column). Instead :func:`span_take` makes one numpy array over the span of addresses from the lowest
chunk to the end of the highest, and takes one value at each row's address. Only the rows'
addresses are read: whatever lies between the chunks (other memory, unmapped pages) is never
touched. The caller holds the chunks for the call (their arrays are in its hands).

Every address must be a multiple of the value's size (Arrow and numpy buffers are 8-byte aligned
or more; a row's offset in its chunk is a multiple of its row size): otherwise None, and the
caller takes the values chunk by chunk as before.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["chunk_addresses", "span_take"]

_I64 = npt.NDArray[np.int64]
_ADDRESS = operator.attrgetter("ctypes.data")
_NBYTES = operator.attrgetter("nbytes")


def chunk_addresses(arrays: Sequence[npt.NDArray[Any]]) -> tuple[_I64, int] | None:
    """The start address of each array (C-contiguous, in the caller's chunk order) and the end of
    the highest one; None for no arrays."""
    if not arrays:
        return None
    starts = np.fromiter(map(_ADDRESS, arrays), dtype=np.int64, count=len(arrays))  # C loops, no Python per chunk
    ends = starts + np.fromiter(map(_NBYTES, arrays), dtype=np.int64, count=len(arrays))
    return starts, int(ends.max())


def span_take(
    starts: _I64, end: int, which: _I64, offsets: _I64, dtype: np.dtype[Any], out: npt.NDArray[Any] | None = None
) -> npt.NDArray[Any] | None:
    """The value of ``dtype`` at byte ``offsets[i]`` of chunk ``which[i]`` (chunk ``k`` starts at
    ``starts[k]``; the highest ends at ``end``), for every ``i``, in one ``take`` (into ``out`` when
    given); None when an address is not a multiple of the value's size."""
    size = dtype.itemsize
    base = int(starts.min())
    addresses = starts[which] + offsets
    if base % size or (addresses % size).any():
        return None
    span: Any = pa.foreign_buffer(base, end - base)  # no owner: only read while the caller holds the chunks
    values = np.frombuffer(span, dtype=dtype, count=(end - base) // size)
    return values.take((addresses - base) // size, out=out)
