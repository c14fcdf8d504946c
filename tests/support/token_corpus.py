"""Small real token corpora for the packing tests: ``.arrow`` shards of one document per row.

Token ids name their document and place: document ``d``'s tokens are ``d * STRIDE + [0, len)``, so
a test can tell from the ids alone which document a token came from and whether documents arrive
whole and in order (checked against an independent numpy reference)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.ipc as ipc

STRIDE = 1000


def write_token_corpus(
    root: Path,
    shard_batches: Sequence[Sequence[int]],
    *,
    seed: int = 0,
    max_len: int = 60,
    list_type: str = "list",
    value_type: pa.DataType | None = None,
    base: int = 0,
) -> npt.NDArray[np.int64]:
    """Shards of record batches with the given documents per batch; returns each document's length.
    Lengths are drawn in [0, max_len] (empty documents included); ``base`` offsets document ids."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vtype = value_type if value_type is not None else pa.int32()
    ltype = pa.large_list(vtype) if list_type == "large_list" else pa.list_(vtype)
    schema = pa.schema([("tokens", ltype), ("doc", pa.int64())])
    doc = base
    lengths: list[int] = []
    for s, batches in enumerate(shard_batches):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as writer:
            for n in batches:
                lens = rng.integers(0, max_len + 1, size=n)
                ids = np.arange(doc, doc + n, dtype=np.int64)
                values = np.repeat(ids * STRIDE, lens) + _ramps(lens)
                offsets = np.r_[0, np.cumsum(lens)]
                otype = pa.int64() if list_type == "large_list" else pa.int32()
                arr = pa.Array.from_buffers(
                    ltype,
                    n,
                    [None, pa.array(offsets, type=otype).buffers()[1]],
                    children=[pa.array(values.astype(vtype.to_pandas_dtype()), type=vtype)],
                )
                writer.write_batch(pa.record_batch([arr, pa.array(ids)], schema=schema))
                doc += n
                lengths.extend(int(x) for x in lens)
    return np.asarray(lengths, dtype=np.int64)


def _ramps(lens: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    total = int(lens.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)


def doc_tokens(doc: int, length: int) -> npt.NDArray[np.int64]:
    return doc * STRIDE + np.arange(length, dtype=np.int64)


def reference_positions(tokens: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """Position ids of one window by the definition (a loop, independent of the server's numpy)."""
    out = np.zeros(len(tokens), dtype=np.int32)
    for i in range(1, len(tokens)):
        out[i] = 0 if tokens[i] % STRIDE == 0 else out[i - 1] + 1
    return out
