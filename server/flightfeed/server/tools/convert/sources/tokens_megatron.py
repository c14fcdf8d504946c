"""Megatron-LM indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, the MMIDIDX format) as documents.

The layout, as ``megatron.core.datasets.indexed_dataset`` (``_IndexWriter`` / ``_IndexReader``)
writes and reads it; little-endian throughout::

    .idx  b"MMIDIDX\\x00\\x00"            9-byte magic
          <Q  version                     1
          <B  dtype code                  1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                                          7 float32, 8 uint16
          <Q  sequence count S
          <Q  document count D            document_indices' length (documents + 1)
          int32[S]  sequence lengths      tokens per sequence
          int64[S]  sequence pointers     byte offset of each sequence in .bin
          int64[D]  document indices      0, then the sequence index where each document ends
          (int8[S]  sequence modes        multimodal datasets only)
    .bin  the tokens of every sequence, back to back, in the dtype above

One row per *document* (``document_indices[d]`` .. ``document_indices[d+1]`` sequences; a GPT
corpus from ``preprocess_data.py`` has one sequence per document, a ``--split-sentences`` one has
several sentences per document, which become one row). ``SRC`` is a prefix, an ``.idx``/``.bin``
file, a directory or a glob (several prefixes: their documents in path order). Every field is
checked against the file sizes; a truncated or inconsistent file fails naming it.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from flightfeed.server.tools.convert.sources.tabular import find_files
from flightfeed.server.tools.convert.sources.tokens import TokenDocuments, TokenPart
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["MAGIC", "DTYPE_CODES", "megatron_source", "megatron_prefixes", "read_megatron"]

MAGIC = b"MMIDIDX\x00\x00"
#: Megatron's DType codes -> numpy dtypes (integers only: token ids)
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}
_FLOAT_CODES = {6: "float64", 7: "float32"}
_HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document indices (34 bytes)


def megatron_prefixes(src: str) -> list[str]:
    """The dataset prefixes at ``src``: ``PREFIX`` itself, ``PREFIX.idx``/``.bin``, or the ``.idx``
    files of a directory or glob (sorted by path)."""
    stem, ext = os.path.splitext(src)
    if ext in (".idx", ".bin") and os.path.isfile(stem + ".idx"):
        return [stem]
    if os.path.isfile(src + ".idx"):
        return [src]
    prefixes = [os.path.splitext(f)[0] for f in find_files(src, (".idx",))]
    if not prefixes:
        raise ConfigError(
            f"{src}: no Megatron indexed dataset found (PREFIX.idx + PREFIX.bin); give the prefix, "
            "its .idx file, or a directory of them"
        )
    return prefixes


def read_megatron(prefix: str) -> TokenPart:
    """One Megatron dataset: its mapped ``.bin`` tokens and its documents' token boundaries."""
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    if not os.path.isfile(bin_path):
        raise DatasetError(f"{idx_path}: its data file {bin_path} is missing")
    idx_size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        head = f.read(_HEAD.size)
    if len(head) < _HEAD.size or head[:9] != MAGIC:
        raise DatasetError(f"{idx_path}: not a Megatron MMIDIDX index (bad header {head[:9]!r})")
    _, version, code, seqs, doc_entries = _HEAD.unpack(head)
    if version != 1:
        raise DatasetError(f"{idx_path}: index version {version}; only version 1 is known")
    if code in _FLOAT_CODES:
        raise DatasetError(f"{idx_path}: holds {_FLOAT_CODES[code]} values, not token ids")
    if code not in DTYPE_CODES:
        raise DatasetError(f"{idx_path}: unknown dtype code {code}")
    dtype = np.dtype(DTYPE_CODES[code])
    need = _HEAD.size + 12 * seqs + 8 * doc_entries
    if idx_size not in (need, need + seqs):  # + seqs: a multimodal index's modes
        raise DatasetError(
            f"{idx_path}: {idx_size} bytes, but {seqs} sequences and {doc_entries} document indices need {need}; "
            "the index is truncated or not MMIDIDX"
        )
    if idx_size != need and seqs:
        raise DatasetError(f"{idx_path}: a multimodal index (sequence modes); only token datasets convert")
    index = np.memmap(idx_path, dtype=np.uint8, mode="r")
    lengths = np.frombuffer(index, np.int32, seqs, _HEAD.size).astype(np.int64)
    pointers = np.frombuffer(index, np.int64, seqs, _HEAD.size + 4 * seqs)
    docs = np.frombuffer(index, np.int64, doc_entries, _HEAD.size + 12 * seqs)
    starts = np.concatenate([[0], np.cumsum(lengths)])  # token offset of each sequence (and the end)
    if (lengths < 0).any() or not np.array_equal(pointers, starts[:-1] * dtype.itemsize):
        raise DatasetError(
            f"{idx_path}: sequence pointers are not the running sum of the sequence lengths; "
            "sequences must lie back to back in the .bin, as Megatron's builder writes them"
        )
    if doc_entries == 0 or docs[0] != 0 or docs[-1] != seqs or (np.diff(docs) < 0).any():
        raise DatasetError(f"{idx_path}: document indices must rise from 0 to the sequence count ({seqs})")
    total = int(starts[-1])
    bin_size = os.path.getsize(bin_path)
    if bin_size != total * dtype.itemsize:
        raise DatasetError(
            f"{bin_path}: {bin_size} bytes, but its index describes {total} {dtype} tokens "
            f"({total * dtype.itemsize} bytes); the pair is truncated or mismatched"
        )
    tokens = np.memmap(bin_path, dtype=dtype, mode="r") if total else np.empty(0, dtype)
    return TokenPart(bin_path, tokens, starts[docs])


def megatron_source(src: str) -> TokenDocuments:
    prefixes = megatron_prefixes(src)
    parts = [read_megatron(p) for p in prefixes]
    return TokenDocuments(f"Megatron indexed dataset ({len(prefixes)} prefix(es))", parts)
