"""nanoGPT's flat token files (``train.bin``/``val.bin``) as a source of documents.

nanoGPT's ``prepare.py`` scripts write every token id of a split into one headerless file of
``np.uint16`` (``np.memmap(..., dtype=np.uint16, mode="w+")``), each document followed by the
tokenizer's end-of-text id (GPT-2: 50256). ``flightfeed convert train.bin DST --from nanogpt
--eot 50256`` cuts the stream after every end-of-text token: each document keeps its end-of-text
token as its last token, so the rows concatenated give back the file exactly. A file that does not
end with the end-of-text id (cut inside its last document, or a wrong ``--eot`` / ``--token-dtype``),
that reads as tokens twice as wide, or in which the id ends documents at no plausible rate is
refused naming the flag (:mod:`.token_checks`). The file is scanned in chunks (no per-token
Python; memory: one int64 per document plus one chunk).

``SRC`` is one file, a directory or a glob of ``.bin`` files (several files: their documents in
path order; point SRC at ``train.bin`` to convert one split).
"""

from __future__ import annotations

import os

import numpy as np

from flightfeed.server.tools.convert.sources.token_checks import check_layout, check_rate
from flightfeed.server.tools.convert.sources.tokens import TokenDocuments, TokenPart, token_dtype
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["nanogpt_source", "document_bounds"]

_SCAN_TOKENS = 1 << 24  # tokens compared with the end-of-text id per step


def document_bounds(tokens: np.ndarray, eot: int) -> np.ndarray:
    """Boundaries of the documents of a flat token stream: after every ``eot`` token, plus the end
    when the stream does not finish with one (``[0, ..., len(tokens)]``, int64)."""
    ends = [np.zeros(1, dtype=np.int64)]
    for start in range(0, len(tokens), _SCAN_TOKENS):
        chunk = tokens[start : start + _SCAN_TOKENS]
        ends.append(np.flatnonzero(chunk == eot).astype(np.int64) + (start + 1))
    bounds = np.concatenate(ends)
    if bounds[-1] != len(tokens):
        bounds = np.append(bounds, np.int64(len(tokens)))
    return bounds


def nanogpt_source(files: list[str], eot: int | None, dtype_name: str) -> TokenDocuments:
    """The documents of nanoGPT token files, cut after each ``eot`` token."""
    if eot is None:
        raise ConfigError(
            "--from nanogpt needs the end-of-text token id that separates documents: pass --eot ID "
            "(GPT-2 / tiktoken 'gpt2': --eot 50256)"
        )
    dtype = token_dtype(dtype_name)
    info = np.iinfo(dtype)
    if not info.min <= eot <= info.max:
        raise ConfigError(f"--eot {eot} does not fit the token dtype {dtype} ([{info.min}, {info.max}])")
    parts = []
    for path in files:
        size = os.path.getsize(path)
        if size % dtype.itemsize:
            raise DatasetError(
                f"{path}: {size} bytes is not a whole number of {dtype} tokens; is --token-dtype right?"
            )
        if size == 0:
            raise DatasetError(f"{path}: the token file is empty")
        tokens = np.memmap(path, dtype=dtype, mode="r")
        check_layout(path, tokens, eot)
        bounds = document_bounds(tokens, eot)
        check_rate(path, len(tokens), len(bounds) - 1, eot, dtype)
        parts.append(TokenPart(path, tokens, bounds))
    return TokenDocuments(f"nanoGPT tokens ({len(files)} file(s), eot {eot})", parts)
