"""The epoch order of 10^9 rows costs memory per block, never per row (docs/large-datasets.md, many shards)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from flightfeed.server.data.order import EpochOrder

ROWS = 10**9


def test_the_order_of_a_billion_rows_is_computed_per_block() -> None:
    block, buffer = 1024, 32768
    blocks = -(-ROWS // block)
    tracemalloc.start()
    try:
        order = EpochOrder(ROWS + 5, "0123456789abcdef0123", 7, 11, True, block, buffer)  # a short last block
        first = order.rows(np.arange(0, 4096, dtype=np.int64))
        last = order.rows(np.arange(ROWS + 5 - 4096, ROWS + 5, dtype=np.int64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one int32 per block (~4 MB here) and a window; one int64 per row would be 8 GB
    assert 4 * blocks <= peak < 3 * 4 * blocks + 4 * 8 * buffer, peak  # (>=: tracemalloc sees numpy's arrays)
    for rows in (first, last):
        assert rows.min() >= 0 and rows.max() < ROWS + 5 and len(np.unique(rows)) == len(rows)


def test_a_narrower_block_permutation_is_the_same_order() -> None:
    """The int32 permutation gives exactly the order an int64 one gave (checkpoints stay valid)."""
    n, block, buffer = 1_000_003, 64, 2048
    order = EpochOrder(n, "fedcba9876543210", 3, 2, True, block, buffer)
    words = (*order._words, 0xB10C)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(words))))
    old = rng.permutation(-(-n // block)).astype(np.int64)  # how the first release drew it
    s = np.arange(0, n, 997, dtype=np.int64)
    nblocks = len(old)
    short = n - (nblocks - 1) * block
    k_short = int(np.flatnonzero(old == nblocks - 1)[0])
    expect = np.where(
        s < k_short * block,
        old[np.minimum(s // block, nblocks - 1)] * block + s % block,
        np.where(
            s < k_short * block + short,
            (nblocks - 1) * block + (s - k_short * block),
            old[np.minimum((s - short + block) // block, nblocks - 1)] * block + (s - short + block) % block,
        ),
    )
    assert np.array_equal(order._unblock(s), expect)
