"""Packed token windows on the CPU path (``_packed``): each lane widens its whole message once
(int64 tokens, int32 positions), the consumer cuts batches as views; batches that span messages
are concatenated, a worker's already-delivered rows are skipped, and the board's window counts
the widened bytes the messages hold, not their smaller wire bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from flightfeed.client import FlightDataset, Pack, ReadOptions
from flightfeed.client._tensors.packed import Buffers, packed_batches, widen_message
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import StreamError
from tests.support.token_corpus import write_token_corpus

WIDTH = 5


def _message(first: int, rows: int) -> pa.RecordBatch:
    """``rows`` windows of uint16 tokens ``first..`` and int16 positions (as the server sends them)."""
    tokens = np.arange(first * WIDTH, (first + rows) * WIDTH, dtype=np.uint16)
    positions = (np.arange(rows * WIDTH) % 7 - 1).astype(np.int16)
    return pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), WIDTH),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(positions), WIDTH),
    })


def test_a_message_is_widened_once_from_sliced_parts() -> None:
    whole = _message(0, 9)
    parts = [whole.slice(0, 4), whole.slice(4, 5)]  # the second part starts at a list offset
    msg = widen_message(parts, "tokens")
    tok_col: Any = whole.column("tokens")
    pos_col: Any = whole.column("position_ids")
    expect_tok = tok_col.values.to_numpy().astype(np.int64).reshape(9, WIDTH)
    expect_pos = pos_col.values.to_numpy().astype(np.int32).reshape(9, WIDTH)
    assert msg.tokens.dtype == torch.int64 and msg.positions.dtype == torch.int32
    np.testing.assert_array_equal(msg.tokens.numpy(), expect_tok)
    np.testing.assert_array_equal(msg.positions.numpy(), expect_pos)
    assert msg.rows == 9 and msg.meta.num_rows == 9 and msg.meta.num_columns == 0
    assert msg.held_bytes == 9 * WIDTH * (8 + 4)
    assert msg.wire_bytes == sum(p.nbytes for p in parts)


def test_a_message_without_the_packed_columns_is_refused() -> None:
    with pytest.raises(StreamError, match="position_ids"):
        widen_message([_message(0, 2).select(["tokens"])], "tokens")


def test_batches_are_views_spanning_messages_are_joined_and_skipped_rows_dropped() -> None:
    messages = [widen_message([_message(0, 5)], "tokens"), widen_message([_message(5, 7)], "tokens")]
    every = torch.cat([m.tokens for m in messages])
    got = list(packed_batches(iter(messages), 4, "tokens", skip=3))
    assert [rows.num_rows for rows, _, _ in got] == [4, 4, 1]  # rows 3..11 of 12
    torch.testing.assert_close(torch.cat([b["tokens"] for _, b, _ in got]), every[3:])
    first = got[0][1]["tokens"]  # rows 3, 4 of the first message and 5, 6 of the second: joined
    torch.testing.assert_close(first, every[3:7])
    second = got[1][1]["tokens"]  # rows 7..10 all in the second message: a view of it
    assert second.untyped_storage().data_ptr() == messages[1].tokens.untyped_storage().data_ptr()
    assert sum(n for _, _, n in got) <= sum(m.wire_bytes for m in messages)


def test_reading_packed_windows_on_the_cpu(tmp_path: Path) -> None:
    """End to end: messages of two batches on three streams give the same windows as the default
    messages, and the board's window counts the widened bytes a message holds (12 per token,
    where the wire carried 4)."""
    write_token_corpus(tmp_path, [[40, 25], [7], [60, 1, 30]], seed=3, max_len=45)
    pack = Pack(column="tokens", seq_len=16, pad_id=-7)
    with running_server({"tok": str(tmp_path)}) as srv:
        plain = FlightDataset(srv.location, "tok", batch_size=3, options=ReadOptions(
            pack=pack, report_interval=None, streams=2))
        odd = FlightDataset(srv.location, "tok", batch_size=3, options=ReadOptions(
            pack=pack, report_interval=None, streams=3, message_rows=6))
        try:
            expected = [{k: v.clone() for k, v in b.items()} for b in plain]
            got: list[dict[str, torch.Tensor]] = []
            for b in odd:
                if not got:  # one message delivered: the window is sized by what it holds
                    (_, lanes), = odd._running
                    board = lanes[0].board
                    assert board._largest == 6 * 17 * (8 + 4)
                got.append({k: v.clone() for k, v in b.items()})
            assert len(got) == len(expected) == len(odd) > 0
            for a, b in zip(expected, got, strict=True):
                assert set(a) == set(b) == {"tokens", "position_ids"}
                for k in a:
                    assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        finally:
            plain.close()
            odd.close()


def test_wide_arrays_are_reused_only_once_nothing_refers_to_them() -> None:
    """A message's arrays go back into use when its message, batches, views and ``.numpy()`` arrays
    are gone, never while one of them lives."""
    pool = Buffers()
    first = widen_message([_message(0, 4)], "tokens", pool)
    ptr = first.tokens.data_ptr()
    view = first.tokens[1:3]  # a batch-like view outlives its message
    as_numpy = first.positions.numpy()
    del first
    second = widen_message([_message(4, 4)], "tokens", pool)
    assert second.tokens.data_ptr() != ptr and len(pool) == 4  # the view keeps the first's arrays
    np.testing.assert_array_equal(view.numpy(), np.arange(1 * WIDTH, 3 * WIDTH).reshape(2, WIDTH))
    pos_ptr = as_numpy.ctypes.data
    del view
    third = widen_message([_message(8, 4)], "tokens", pool)
    assert third.tokens.data_ptr() == ptr  # the tokens array is free again ...
    assert third.positions.data_ptr() != pos_ptr  # ... the positions one is still seen through .numpy()
    np.testing.assert_array_equal(third.tokens.numpy(), np.arange(8 * WIDTH, 12 * WIDTH).reshape(4, WIDTH))
    assert widen_message([_message(0, 3)], "tokens", pool).rows == 3  # another shape: a new array


@pytest.mark.parametrize("targets", [None, "shifted"])
def test_batches_kept_across_an_epoch_are_not_overwritten(tmp_path: Path, targets: str | None) -> None:
    """Reused arrays never hold a batch that the trainer still has: an epoch's batches kept as they
    came (no clone) equal a cloned read at the end, with small messages so arrays turn over (also
    shifted inputs and targets: views of one flat array per message)."""
    write_token_corpus(tmp_path, [[40, 25], [7], [60, 1, 30]], seed=3, max_len=45)
    pack = Pack(column="tokens", seq_len=16, pad_id=-7, targets=targets)
    with running_server({"tok": str(tmp_path)}) as srv:
        ds = FlightDataset(srv.location, "tok", batch_size=3, options=ReadOptions(
            pack=pack, report_interval=None, streams=2, message_rows=3))
        try:
            kept = list(ds)  # views of the messages' arrays
            half = [b for i, b in enumerate(ds) if i % 2 == 0]  # drop every other batch: arrays turn over
            cloned = [{k: v.clone() for k, v in b.items()} for b in ds]
            assert len(kept) == len(cloned) > 10
            for a, b in zip(kept, cloned, strict=True):
                for k in a:
                    assert torch.equal(a[k], b[k]), k
            for a, b in zip(half, cloned[::2], strict=True):
                for k in a:
                    assert torch.equal(a[k], b[k]), k
        finally:
            ds.close()
