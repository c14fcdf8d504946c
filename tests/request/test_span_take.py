"""One take over the address span of several chunks (``request/span_take``) reads exactly each
row's value, from chunks that lie anywhere in memory, and refuses unaligned addresses."""

from __future__ import annotations

import numpy as np
import pytest

from flightfeed.server.request.span_take import chunk_addresses, span_take


def test_values_of_rows_in_separate_chunks_in_message_order() -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 1 << 40, (n, 1), dtype=np.int64) for n in (7, 300, 1, 64)]
    gap = np.zeros(1 << 20, dtype=np.int64)  # other memory between the chunks is never read
    chunks.insert(2, rng.integers(0, 9, (5, 1), dtype=np.int64))
    which = rng.integers(0, len(chunks), 500)
    local = np.array([rng.integers(0, len(chunks[k])) for k in which])
    located = chunk_addresses(chunks)
    assert located is not None
    out = np.empty(500, dtype=np.int64)
    got = span_take(located[0], located[1], which, local * 8, np.dtype(np.int64), out)
    assert got is out
    assert (out == np.array([chunks[k][r, 0] for k, r in zip(which, local, strict=True)])).all()
    del gap


def test_the_first_bytes_of_wide_rows() -> None:
    rows = [(np.arange(3 * 4096) * (k + 1) % 251).astype(np.uint8).reshape(3, 4096) for k in range(3)]
    located = chunk_addresses(rows)
    assert located is not None
    which, local = np.array([2, 0, 1, 2]), np.array([1, 2, 0, 0])
    got = span_take(located[0], located[1], which, local * 4096, np.dtype(np.int32))
    want = np.array([rows[k][r, :4].view(np.int32)[0] for k, r in zip(which, local, strict=True)])
    assert got is not None and (got == want).all()


@pytest.mark.parametrize("shift", [1, 2, 3])
def test_an_unaligned_address_is_refused(shift: int) -> None:
    raw = np.zeros(64 + shift, dtype=np.uint8)
    chunk = raw[shift : shift + 64].view(np.uint8).reshape(16, 4)
    located = chunk_addresses([chunk])
    assert located is not None
    assert span_take(located[0], located[1], np.zeros(2, np.int64), np.array([0, 4]), np.dtype(np.int32)) is None
    assert chunk_addresses([]) is None
