"""Shuffled HDF5 reads at HDF5's pace: blocks are whole decoded chunks, a window fits in the chunk
cache with its read-ahead, each chunk is decoded once per shuffled epoch (counted in
``flightfeed_chunk_decodes_total`` and ``/stats``), and a chunk is never decoded twice at once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.data.chunk_cache import ChunkCache
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.shuffle_sizing import chunk_aligned_shuffle, shuffle_defaults
from flightfeed.server.storage import StorageOptions, open_dataset
from flightfeed.server.testing import running_server

ROWS = 8192
CACHE = 16 << 20  # the data: 32 MiB decoded


def _stack(path: Path) -> None:
    """8192 rows of 64x64 uint8 'images' (4 KiB), gzip, 64-row HDF5 chunks: 1 MiB served chunks."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (64, 64), dtype=np.uint8)
    with h5py.File(path, "w") as f:
        images = f.create_dataset("image", (ROWS, 64, 64), np.uint8, chunks=(64, 64, 64), compression="gzip")
        for lo in range(0, ROWS, 512):
            images[lo : lo + 512] = (base[None] + np.arange(lo, lo + 512)[:, None, None]).astype(np.uint8)
        f.create_dataset("label", data=np.arange(ROWS) % 10, chunks=(256,))


@pytest.fixture
def stack(tmp_path: Path) -> Path:
    path = tmp_path / "stack.h5"
    _stack(path)
    return path


def test_blocks_are_chunks_and_windows_fit_the_cache(stack: Path) -> None:
    ds = open_dataset("stack", str(stack), StorageOptions(chunk_cache_bytes=CACHE))
    try:
        chunk_rows = int(ds.chunk_starts[1])
        assert chunk_rows == 256  # four 64-row HDF5 chunks: 1 MiB
        assert all(int(s) % chunk_rows == 0 for s in ds.chunk_starts)
        block, buffer = shuffle_defaults(ds, readahead_windows=1)
        assert block == chunk_rows
        assert buffer % chunk_rows == 0
        window_bytes = buffer * ds.row_bytes()
        assert 3.25 * window_bytes <= CACHE  # the previous window, the one served, the next one, a margin
        assert buffer // block >= 4
        bigger = open_dataset("stack2", str(stack), StorageOptions(chunk_cache_bytes=4 * CACHE))
        try:
            assert chunk_aligned_shuffle(bigger, 1)[1] > buffer  # a larger cache: larger windows
        finally:
            bigger.close()
        # every block of the epoch's order is one whole chunk
        order = EpochOrder(ds.num_rows, ds.fingerprint, 0, 0, True, block, buffer)
        for lo in range(0, ds.num_rows, buffer):
            for first, rows in order.stored_runs(lo, lo + buffer):
                assert first % chunk_rows == 0 and rows % chunk_rows == 0
    finally:
        ds.close()


def _decodes(server_metrics: object, name: str) -> float:
    value = server_metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "flightfeed_chunk_decodes_total", {"dataset": name}
    )
    return float(value or 0.0)


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_each_chunk_decoded_once_per_shuffled_epoch(stack: Path, read_ahead: int) -> None:
    from flightfeed.client import FlightDataset, ReadOptions
    from flightfeed.server.request.streaming import StreamSettings

    options = StorageOptions(chunk_cache_bytes=CACHE)
    settings = StreamSettings(readahead_windows=read_ahead)
    with running_server({"stack": str(stack)}, storage=options, settings=settings) as server:
        ds = server.catalog.get("stack")
        chunks = ds.num_chunks
        assert chunks == 32 and ds.nbytes > CACHE
        decoded: list[int] = []
        load = ds.chunk_cache.get_or_load

        def spy(key: int, loader: Callable[[], pa.RecordBatch]) -> pa.RecordBatch:
            def counted() -> pa.RecordBatch:
                decoded.append(key)
                return loader()

            return load(key, counted)

        ds.chunk_cache.get_or_load = spy  # type: ignore[method-assign,assignment]
        one = ReadOptions(streams=1)
        loader = FlightDataset(server.location, "stack", batch_size=64, shuffle=True, seed=1, options=one)
        per_epoch = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            before, first = _decodes(server.metrics, "stack"), len(decoded)
            labels = np.concatenate([b["label"].numpy() for b in loader])
            per_epoch.append(_decodes(server.metrics, "stack") - before)
            assert np.array_equal(np.sort(labels), np.sort(np.arange(ROWS) % 10))
            keys = decoded[first:]
            assert per_epoch[-1] == len(keys)  # the metric counts the decodes
            repeated = sorted({k for k in keys if keys.count(k) > 1})
            assert repeated in ([], [0]), repeated  # each chunk once (chunk 0 is probed for the row size first)
        assert per_epoch[0] >= chunks  # a cold cache: every chunk decoded
        assert per_epoch[1] <= chunks  # (chunks still cached from epoch 0 are not decoded again)
        client = flight.connect(server.location)
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        client.close()
    fig = stats["chunk_cache"]["stack"]
    assert fig["chunks"] == 32
    assert fig["decodes"] >= sum(per_epoch)
    assert fig["decodes_per_chunk"] == fig["decodes"] / 32
    assert fig["max_bytes"] == CACHE
    assert fig["bytes"] <= CACHE


def test_a_chunk_is_decoded_once_when_asked_for_at_once() -> None:
    cache = ChunkCache(1 << 20)
    started = threading.Event()
    calls = []

    def load() -> pa.RecordBatch:
        calls.append(1)
        started.set()
        time.sleep(0.05)  # other threads ask meanwhile (a real decode takes as long)
        return pa.record_batch({"x": pa.array([1, 2, 3])})

    results: list[pa.RecordBatch] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_load(7, load))) for _ in range(4)]
    threads[0].start()
    started.wait()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert cache.decodes == 1 and cache.hits == 3
    assert all(r.equals(results[0]) for r in results)


def test_a_failed_decode_is_retried_by_the_next_reader() -> None:
    cache = ChunkCache(1 << 20)
    with pytest.raises(OSError, match="disk"):
        cache.get_or_load(1, lambda: (_ for _ in ()).throw(OSError("disk")))
    assert 1 not in cache
    assert cache.get_or_load(1, lambda: pa.record_batch({"x": [1]})).num_rows == 1
    assert cache.decodes == 1


def test_evictions_are_counted() -> None:
    cache = ChunkCache(100)
    big = pa.record_batch({"x": pa.array(np.zeros(10, np.int64))})  # 80 bytes
    for key in range(3):
        cache.get_or_load(key, lambda: big)
    assert cache.evictions == 2
    assert cache.figures()["chunks_cached"] == 1


def test_deflate_chunks_decoded_outside_hdf5_equal_h5py(tmp_path: Path) -> None:
    """gzip (+ shuffle) chunks inflated outside h5py's lock: big-endian values, a partial last chunk
    and chunks never written (HDF5's fill value) read exactly as h5py reads them."""
    from flightfeed.server.readers.hdf5.reader import open_hdf5_shard

    path = tmp_path / "deflate.h5"
    with h5py.File(path, "w") as f:
        data = np.arange(1000 * 3, dtype=">f8").reshape(1000, 3) / 7
        f.create_dataset("be", data=data, chunks=(64, 3), compression="gzip", shuffle=True)
        sparse = f.create_dataset("sparse", (1000,), "<i4", chunks=(100,), compression="gzip", fillvalue=-7)
        sparse[0:100] = np.arange(100)
        f.create_dataset("tiled", data=np.zeros((1000, 4)), chunks=(100, 2), compression="gzip")  # not whole rows
    shard = open_hdf5_shard(str(path), target_chunk_bytes=5000)
    assert set(shard._fast) == {"/be", "/sparse"}
    batches = [shard.read_chunk(i) for i in range(len(shard.chunk_offsets) - 1)]
    with h5py.File(path, "r") as f:
        for name in ("be", "sparse"):
            columns = [b.column(name) for b in batches]
            got = np.concatenate(
                [c.to_numpy_ndarray() if isinstance(c, pa.FixedShapeTensorArray) else c.to_numpy() for c in columns]
            )
            want = f[name][()]
            assert got.dtype == want.dtype.newbyteorder("=")
            assert got.tobytes() == want.astype(got.dtype).tobytes(), name
    shard.close()
