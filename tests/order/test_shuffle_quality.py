"""Shuffle quality is measured, not assumed: a label-sorted dataset must give batches whose class
mix is close to uniform random sampling, with no trace of the stored order."""

from __future__ import annotations

import numpy as np
import pytest

from flightfeed.server.data.order import EpochOrder, default_shuffle


def quality(n: int, row_bytes: int, batch: int = 64, classes: int = 10) -> tuple[float, float, float]:
    labels = np.arange(n) * classes // n  # sorted by label
    block, buffer = default_shuffle(row_bytes, n)
    rows = EpochOrder(n, "ab" * 10, 0, 0, True, block, buffer).rows(np.arange(n))
    usable = n // batch * batch
    ours = np.mean([len(np.unique(b)) for b in labels[rows][:usable].reshape(-1, batch)])
    rand = np.mean(
        [len(np.unique(b)) for b in labels[np.random.default_rng(1).permutation(n)][:usable].reshape(-1, batch)]
    )
    corr = abs(float(np.corrcoef(np.arange(n), rows)[0, 1]))
    return float(ours), float(rand), corr


@pytest.mark.parametrize(("n", "row_bytes"), [(100_000, 64), (50_000, 150_528), (20_000, 4096)])
def test_default_buffer_mixes_like_random_sampling(n: int, row_bytes: int) -> None:
    ours, rand, corr = quality(n, row_bytes)
    assert ours >= 0.9 * rand, (ours, rand)
    assert corr < 0.05
