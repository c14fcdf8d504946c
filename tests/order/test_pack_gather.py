"""``pack_windows`` against a plain reference, window by window: the stream of the epoch plan's
documents cut into windows, position ids by their definition (a loop), for window lengths from 1
(every token a window's last) up, runs of windows anywhere in the epoch (a message may hold several,
as a rank's share does), documents crossing chunks and shards, empty documents, the padded tail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.packing import PackSpec, epoch_plan
from flightfeed.server.request.pack_gather import pack_windows
from flightfeed.server.storage.resolve import open_catalog
from tests.support.token_corpus import doc_tokens, reference_positions, write_token_corpus


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dataset, np.ndarray]]:
    root = tmp_path_factory.mktemp("gather")
    lengths = write_token_corpus(root, [[30, 9], [4], [25, 1, 20]], seed=11, max_len=40)
    catalog = open_catalog({"tok": str(root)})
    try:
        yield catalog.get("tok"), lengths
    finally:
        catalog.close()


def _reference(stream: np.ndarray, spec: PackSpec, w0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    width = spec.seq_len + 1
    tokens = np.full((n, width), spec.pad_id, dtype=np.int64)
    positions = np.full((n, width), -1, dtype=np.int32)
    for r in range(n):
        piece = stream[(w0 + r) * spec.seq_len : (w0 + r) * spec.seq_len + width]
        tokens[r, : len(piece)] = piece
        positions[r, : len(piece)] = reference_positions(piece)
    return tokens, positions


@pytest.mark.parametrize("seq_len", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("pad", [False, True])
def test_windows_and_positions_match_the_reference(dataset: tuple[Dataset, np.ndarray], seq_len: int,
                                                   pad: bool) -> None:
    ds, lengths = dataset
    spec = PackSpec("tokens", seq_len, pad_tail=pad, pad_id=-3)
    plan = epoch_plan(ds, spec, EpochOrder(ds.num_rows, ds.fingerprint, 5, 1, True, 4, 16))
    stream = np.concatenate([doc_tokens(int(d), int(lengths[d])) for d in plan.perm.tolist()])
    windows = spec.num_windows(len(stream))
    runs_list = [[(0, windows)], [(0, 1), (windows - 1, 1)], [(windows // 3, 2), (0, 3), (windows - 2, 2)]]
    for runs in runs_list:
        runs = [(w, n) for w, n in runs if w >= 0 and n > 0 and w + n <= windows]
        rb = pack_windows(ds, plan, spec, pa.int32(), runs)
        tok_col: Any = rb.column("tokens")
        pos_col: Any = rb.column("position_ids")
        assert rb.num_rows == sum(n for _, n in runs)
        assert pos_col.type.value_type == pa.int16()
        got_tok = tok_col.values.to_numpy().reshape(rb.num_rows, seq_len + 1)
        got_pos = pos_col.values.to_numpy().reshape(rb.num_rows, seq_len + 1)
        row = 0
        for w0, n in runs:
            want_tok, want_pos = _reference(stream, spec, w0, n)
            np.testing.assert_array_equal(got_tok[row : row + n], want_tok, err_msg=f"{runs} tokens")
            np.testing.assert_array_equal(got_pos[row : row + n], want_pos, err_msg=f"{runs} positions")
            row += n
