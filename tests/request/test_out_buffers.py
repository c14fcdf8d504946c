"""Gathered wide rows go into reused output blocks: a block comes back only when nothing can
read it any more, and the next messages reuse it (no fresh pages, so no page faults, per message)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.request import fixed_rows
from flightfeed.server.request.gather import gather
from flightfeed.server.request.out_buffers import OutBuffers, shared_out_buffers
from flightfeed.server.storage import open_dataset

WIDTH = 24 << 10  # 24 KiB rows: copied run by run (fixed_rows.RUN_MIN_BYTES)
TENSOR = pa.fixed_shape_tensor(pa.uint8(), [WIDTH])


def _filled(pool: OutBuffers, nbytes: int, value: int) -> pa.Buffer:
    view, buf = pool.take(nbytes)
    view[:] = value
    return buf


def test_a_block_comes_back_only_when_nothing_holds_it() -> None:
    pool = OutBuffers(retain_bytes=64 << 20)
    buf = _filled(pool, 3 << 20, 7)
    arr = pa.Array.from_buffers(pa.uint8(), 3 << 20, [None, buf])
    kept = arr.slice(100, 1000)  # a zero-copy slice still reads the block
    first = buf.address
    del buf, arr
    gc.collect()
    assert pool.free_bytes == 0
    other = _filled(pool, 3 << 20, 9)  # the held block is not handed out again
    assert other.address != first
    assert np.all(np.asarray(kept) == 7)
    del kept
    gc.collect()
    assert pool.free_bytes >= 3 << 20
    again = _filled(pool, 3 << 20, 1)
    assert again.address == first
    assert pool.made == 2 and pool.taken == 3


def test_free_blocks_beyond_the_retained_bytes_are_let_go() -> None:
    pool = OutBuffers(retain_bytes=4 << 20)
    held = [_filled(pool, 3 << 20, k) for k in range(3)]
    del held
    gc.collect()
    assert pool.free_bytes == 3 << 20  # a second block of 3 MiB would not fit: one kept


def test_a_small_message_does_not_take_a_much_larger_block() -> None:
    pool = OutBuffers()
    big = _filled(pool, 32 << 20, 0)
    del big
    gc.collect()
    small = _filled(pool, 1 << 20, 0)
    assert pool.made == 2 and pool.free_bytes >= 32 << 20
    del small


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[tuple[Dataset, np.ndarray]]:
    """Two shards of three chunks of 40 rows; row ``i`` is filled with ``i % 251``."""
    schema = pa.schema([("image", TENSOR), ("index", pa.int64())])
    values = np.arange(240, dtype=np.int64)
    for s in range(2):
        with ipc.new_file(str(tmp_path / f"part-{s:05d}.arrow"), schema) as writer:
            for c in range(3):
                idx = values[s * 120 + c * 40 : s * 120 + (c + 1) * 40]
                pixels = np.repeat((idx % 251).astype(np.uint8), WIDTH)
                storage = pa.FixedSizeListArray.from_arrays(pa.array(pixels), WIDTH)
                writer.write_batch(
                    pa.record_batch([pa.ExtensionArray.from_storage(TENSOR, storage), pa.array(idx)], schema=schema)
                )
    ds = open_dataset("wide", str(tmp_path))
    yield ds, values
    ds.close()


def _check(batch: pa.RecordBatch, rows: np.ndarray) -> None:
    assert batch.column("index").to_numpy().tolist() == rows.tolist()
    column: Any = batch.column("image")
    pixels = np.asarray(column.storage.flatten()).reshape(len(rows), WIDTH)
    assert (pixels == (rows % 251).astype(np.uint8)[:, None]).all()


def test_wide_rows_in_runs_and_alone_arrive_in_message_order(wide: tuple[Dataset, np.ndarray]) -> None:
    """Runs of consecutive rows (within a chunk, across a chunk edge, across shards), single rows
    and repeats, in any order: every row where the message puts it."""
    ds, _ = wide
    rng = np.random.default_rng(3)
    rows = np.concatenate(
        [np.arange(35, 47), rng.permutation(240)[:30], np.arange(118, 123), [5, 5, 6], np.arange(200, 180, -1)]
    ).astype(np.int64)
    _check(gather(ds, rows, None), rows)
    _check(gather(ds, rows[:1], None), rows[:1])


def test_later_messages_reuse_the_blocks_and_never_write_into_a_held_one(
    wide: tuple[Dataset, np.ndarray],
) -> None:
    """The served path's defect: every message's output was fresh memory (faulted and zeroed by
    the kernel). Now a message's block is reused once its message is gone, and a message still
    held (by gRPC, the share window or a caller) keeps its bytes while later ones are gathered."""
    ds, _ = wide
    pool = shared_out_buffers()
    rng = np.random.default_rng(4)
    held_rows = rng.permutation(240)[:64].astype(np.int64)
    held = gather(ds, held_rows, None)
    for _ in range(3):  # warm: the blocks these messages need exist
        gather(ds, rng.permutation(240)[:64].astype(np.int64), None)
    gc.collect()
    made = pool.made
    for _ in range(20):
        rows = rng.permutation(240)[:64].astype(np.int64)
        _check(gather(ds, rows, None), rows)
    assert pool.made == made
    _check(held, held_rows)


def test_narrow_rows_do_not_use_the_blocks(tmp_path: Path) -> None:
    """Rows under ``RUN_MIN_BYTES`` keep the one Arrow call (a view per row would cost more)."""
    assert fixed_rows.RUN_MIN_BYTES > 4096
    t = pa.fixed_shape_tensor(pa.uint8(), [4096])
    schema = pa.schema([("x", t)])
    with ipc.new_file(str(tmp_path / "part-00000.arrow"), schema) as writer:
        for c in range(2):
            flat = np.repeat(np.arange(c * 50, c * 50 + 50, dtype=np.uint8), 4096)
            writer.write_batch(pa.record_batch([pa.ExtensionArray.from_storage(
                t, pa.FixedSizeListArray.from_arrays(pa.array(flat), 4096))], schema=schema))
    ds = open_dataset("narrow", str(tmp_path))
    taken = shared_out_buffers().taken
    rows = np.random.default_rng(0).permutation(100).astype(np.int64)
    column: Any = gather(ds, rows, None).column(0)
    got = np.asarray(column.storage.flatten()).reshape(100, 4096)
    assert (got == rows.astype(np.uint8)[:, None]).all()
    assert shared_out_buffers().taken == taken
    ds.close()


def test_a_block_coming_back_while_the_pool_is_busy_on_the_same_thread_does_not_deadlock() -> None:
    """The last reference may go inside a garbage collection pass while this thread holds the
    pool's lock (or on a gRPC thread at any moment): giving the block back takes no lock."""
    import threading

    pool = OutBuffers()
    buf = _filled(pool, 1 << 20, 3)
    address = buf.address
    held = [buf]
    del buf

    def drop_under_the_lock() -> None:
        with pool._lock:
            held.clear()  # the finalizer runs here, on this thread, lock held
            gc.collect()

    worker = threading.Thread(target=drop_under_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert pool.free_bytes == 1 << 20
    assert _filled(pool, 1 << 20, 4).address == address
