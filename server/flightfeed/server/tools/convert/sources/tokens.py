"""Token corpora as ``flightfeed convert`` sources: one row per document, one ragged column.

A tokenized corpus is a flat array of token ids plus document boundaries. Both LLM formats read
here (nanoGPT's flat ``train.bin`` and Megatron-LM's ``.bin`` + ``.idx``) become
:class:`TokenDocuments`: the token files are memory-mapped, the boundaries are one int64 per
document (8 bytes per document in memory: 80 MB for 10^7 documents), and each record batch is
built from a slice of the mapped tokens and of the boundaries (no Python per token or per
document). The output column is ``tokens``, a ``list<DTYPE>`` in the corpus's own dtype
(nanoGPT: uint16), so a converted dataset holds exactly the source's tokens, in order: row ``i``
is document ``i``, and concatenating the rows gives back the token stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["TOKEN_COLUMN", "TOKEN_DTYPES", "TokenPart", "TokenDocuments", "token_dtype"]

#: the column a token corpus becomes
TOKEN_COLUMN = "tokens"
#: token dtypes a flat token file may hold (``--token-dtype``)
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64", "uint8")
_INT32_MAX = 2**31 - 1


def token_dtype(name: str) -> np.dtype[Any]:
    if name not in TOKEN_DTYPES:
        raise ConfigError(f"--token-dtype {name!r}: use one of {', '.join(TOKEN_DTYPES)}")
    return np.dtype(name)


@dataclass(frozen=True)
class TokenPart:
    """One token file: its mapped tokens and its documents' boundaries (``len = documents + 1``,
    ``bounds[0] == 0``, ``bounds[-1] == len(tokens)``: document ``d`` is ``tokens[bounds[d]:bounds[d+1]]``)."""

    path: str
    tokens: npt.NDArray[Any]
    bounds: npt.NDArray[np.int64]

    @property
    def documents(self) -> int:
        return len(self.bounds) - 1


class TokenDocuments:
    """A ``convert`` source over token files: one row per document, column ``tokens``."""

    def __init__(self, description: str, parts: Sequence[TokenPart]) -> None:
        dtypes = {p.tokens.dtype for p in parts}
        if len(dtypes) != 1:
            shown = ", ".join(f"{p.path}: {p.tokens.dtype}" for p in parts)
            raise DatasetError(f"token files hold different dtypes ({shown}); convert them separately")
        self.description = description
        self._parts = list(parts)
        self.schema = pa.schema([pa.field(TOKEN_COLUMN, pa.list_(pa.from_numpy_dtype(dtypes.pop())))])
        self.num_rows = sum(p.documents for p in self._parts)
        self.num_tokens = sum(int(p.bounds[-1]) for p in self._parts)
        #: mean bytes per document over the whole corpus (tokens + one int32 offset): convert sizes
        #: its record batches from it when it asks (a probe of the first documents can be far off)
        itemsize = self._parts[0].tokens.dtype.itemsize if self._parts else 1
        self.row_bytes = max(1, (self.num_tokens * itemsize + 4 * self.num_rows) // max(1, self.num_rows))

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for part in self._parts:
            for d in range(0, part.documents, rows):
                yield _documents(part, d, min(d + rows, part.documents))

    def close(self) -> None:
        self._parts = []


def _documents(part: TokenPart, first: int, stop: int) -> pa.RecordBatch:
    """Documents ``[first, stop)`` of ``part`` as one record batch (its tokens: a view of the map)."""
    bounds = part.bounds[first : stop + 1]
    lo, hi = int(bounds[0]), int(bounds[-1])
    if hi - lo > _INT32_MAX and stop - first == 1:
        raise DatasetError(
            f"{part.path}: document {first} holds {hi - lo} tokens, more than one row can hold (2**31 - 1); "
            "for a nanoGPT file, is --eot the end-of-text id its tokenizer wrote?"
        )
    if hi - lo > _INT32_MAX:
        raise ConfigError(
            f"{part.path}: documents {first}..{stop - 1} hold {hi - lo} tokens, more than one record batch "
            "can index; pass a smaller --rows-per-batch"
        )
    offsets: Any = pa.array((bounds - lo).astype(np.int32), pa.int32())
    values = pa.array(part.tokens[lo:hi])
    column = pa.ListArray.from_arrays(offsets, values)
    return pa.RecordBatch.from_arrays([column], names=[TOKEN_COLUMN])
