"""The shuffled gather and the stored-order slices keep every Arrow type bit-exact, and the gather
runs no Python per row (rows of any width are copied in native code)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.request import fixed_rows
from flightfeed.server.request import gather as gather_module
from flightfeed.server.request.gather import contiguous, gather
from flightfeed.server.storage import open_dataset

TENSOR = pa.fixed_shape_tensor(pa.uint8(), [8, 8, 3])  # 192-byte rows: the binary-view copy
WIDE = pa.list_(pa.float32(), 32)  # 128-byte rows: the binary-view copy
SMALL = pa.list_(pa.float32(), 4)  # 16-byte rows: the numpy copy
SCHEMA = pa.schema(
    [
        ("image", TENSOR),
        ("wide", WIDE),
        ("vec4", SMALL),
        ("index", pa.int64()),
        ("tiny", pa.int8()),
        ("name", pa.string()),
        ("blob", pa.binary()),
        ("tokens", pa.list_(pa.int32())),
        ("boxes", pa.list_(pa.list_(pa.float32(), 4))),
        ("big", pa.large_list(pa.int64())),
        ("meta", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        ("maybe", pa.list_(pa.float32(), 32)),  # nulls in some chunks: the generic path
    ]
)


def _batch(rng: np.random.Generator, lo: int, n: int, nulls: bool) -> pa.RecordBatch:
    idx = np.arange(lo, lo + n)
    lengths = rng.integers(0, 6, n)
    tokens = [rng.integers(-(2**31), 2**31 - 1, k, dtype=np.int64).astype(np.int32).tolist() for k in lengths]
    boxes = [rng.standard_normal((k, 4)).astype(np.float32).tolist() for k in lengths]
    wide = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 32).astype(np.float32)), 32)
    maybe_vals = pa.array(rng.standard_normal(n * 32).astype(np.float32))
    mask = pa.array(idx % 5 == 0) if nulls else None
    maybe = pa.FixedSizeListArray.from_arrays(maybe_vals, 32, mask=mask)
    pixels = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, n * 192, dtype=np.uint8)), 192)
    return pa.record_batch(
        [
            pa.ExtensionArray.from_storage(TENSOR, pixels),
            wide,
            pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * 4).astype(np.float32)), 4),
            pa.array(idx.astype(np.int64)),
            pa.array((idx % 100).astype(np.int8)),
            pa.array([f"row-{i}" * int(i % 3) for i in idx]),
            pa.array([bytes(rng.integers(0, 256, int(i % 7), dtype=np.uint8)) for i in idx], type=pa.binary()),
            pa.array(tokens, type=pa.list_(pa.int32())),
            pa.array(boxes, type=pa.list_(pa.list_(pa.float32(), 4))),
            pa.array([list(range(int(i % 4))) for i in idx], type=pa.large_list(pa.int64())),
            pa.array([{"a": int(i), "b": f"m{i}"} for i in idx], type=SCHEMA.field("meta").type),
            maybe,
        ],
        schema=SCHEMA,
    )


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dataset, pa.Table]:
    """Three shards of uneven record batches (nulls in the second shard only) and the same rows
    as one plain Table (the reference)."""
    root = tmp_path_factory.mktemp("typed")
    rng = np.random.default_rng(7)
    row, batches = 0, []
    for s, sizes in enumerate([[37, 64, 5], [50, 50], [1, 90, 23]]):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), SCHEMA) as writer:
            for n in sizes:
                b = _batch(rng, row, n, nulls=s == 1)
                writer.write_batch(b)
                batches.append(b)
                row += n
    ds = open_dataset("typed", str(root))
    return ds, pa.Table.from_batches(batches)


def _same(got: pa.RecordBatch, want: pa.Table) -> None:
    assert got.schema == want.schema
    for name in want.column_names:
        g, w = got.column(name), want.column(name).combine_chunks()
        assert g.type == w.type, name
        assert g.equals(w), name  # values, nulls and list offsets' meaning


@pytest.mark.parametrize("count", [1, 7, 150, 320])
def test_gather_is_a_plain_take_for_every_type(typed: tuple[Dataset, pa.Table], count: int) -> None:
    ds, table = typed
    rows = np.random.default_rng(count).permutation(table.num_rows)[:count].astype(np.int64)
    _same(gather(ds, rows, None), table.take(rows))


@pytest.mark.parametrize("join_bytes", [0, 1 << 30])
def test_small_rows_joined_or_taken_per_chunk_alike(
    typed: tuple[Dataset, pa.Table], join_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small fixed-width rows are taken from the touched chunks joined (one numpy take) or chunk by
    chunk (a take per chunk and a scatter): the same rows, repeated rows included."""
    ds, table = typed
    monkeypatch.setattr(fixed_rows, "JOIN_BYTES_PER_CHUNK", join_bytes)
    rows = np.random.default_rng(11).integers(0, table.num_rows, 300).astype(np.int64)
    _same(gather(ds, rows, ["vec4", "index", "tiny"]), table.select(["vec4", "index", "tiny"]).take(rows))


def test_gather_with_repeated_rows_and_a_column_subset(typed: tuple[Dataset, pa.Table]) -> None:
    ds, table = typed
    rows = np.array([3, 3, 200, 0, 319, 3, 120, 121, 122], dtype=np.int64)
    columns = ["boxes", "image", "tokens", "maybe"]
    _same(gather(ds, rows, columns), table.select(columns).take(rows))


def test_gather_of_no_rows(typed: tuple[Dataset, pa.Table]) -> None:
    ds, table = typed
    got = gather(ds, np.empty(0, dtype=np.int64), None)
    assert got.num_rows == 0 and got.schema == table.schema


def test_stored_order_slices_keep_every_type(typed: tuple[Dataset, pa.Table]) -> None:
    ds, table = typed
    for start, stop, batch_rows in [(0, table.num_rows, 0), (30, 250, 16), (101, 102, 1)]:
        parts = list(contiguous(ds, start, stop, batch_rows, None))
        got = pa.Table.from_batches(parts).combine_chunks()
        _same(got.to_batches()[0], table.slice(start, stop - start))


def test_streams_gather_concurrently_and_alike(typed: tuple[Dataset, pa.Table]) -> None:
    """Several threads gathering at once (the streams of one process) get exactly their rows."""
    ds, table = typed
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(5):
                rows = rng.permutation(table.num_rows)[:100].astype(np.int64)
                _same(gather(ds, rows, ["image", "wide", "tokens", "index"]), table.select(
                    ["image", "wide", "tokens", "index"]).take(rows))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _traced_gather(ds: Dataset, rows: np.ndarray[Any, np.dtype[np.int64]]) -> tuple[pa.RecordBatch, int]:
    """``gather(ds, rows)`` and the Python lines it ran in ``fixed_rows`` and ``gather``."""
    lines = 0
    files = {fixed_rows.__file__, gather_module.__file__}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if frame.f_code.co_filename in files:
            if event == "line":
                lines += 1
            return tracer
        return None

    sys.settrace(tracer)
    try:
        batch = gather(ds, rows, None)
    finally:
        sys.settrace(None)
    return batch, lines


def test_wide_rows_are_gathered_by_native_code_not_per_row(tmp_path: Path) -> None:
    """Python lines run by the gather do not grow with the rows of a message: 10x the rows of
    16 KiB+ images over the same chunks cost the same Python (the old code looped per row)."""
    width = 20 << 10
    tensor = pa.fixed_shape_tensor(pa.uint8(), [width])
    schema = pa.schema([("image", tensor)])
    with ipc.new_file(str(tmp_path / "part-00000.arrow"), schema) as writer:
        for c in range(4):
            flat = pa.array(np.full(200 * width, c, dtype=np.uint8))
            writer.write_batch(pa.record_batch([pa.ExtensionArray.from_storage(
                tensor, pa.FixedSizeListArray.from_arrays(flat, width))], schema=schema))
    ds = open_dataset("wide", str(tmp_path))
    rng = np.random.default_rng(0)

    def lines_for(count: int) -> int:
        rows = np.sort(rng.permutation(800)[:count]).astype(np.int64)[::-1].copy()
        batch, lines = _traced_gather(ds, rows)
        column: Any = batch.column(0)
        pixels = np.asarray(column.storage.flatten()).reshape(count, width)
        assert (pixels == (rows // 200).astype(np.uint8)[:, None]).all()
        return lines

    few, many = lines_for(20), lines_for(200)
    assert many <= few + 10, (few, many)
    ds.close()


def test_no_python_line_runs_per_chunk_a_message_touches(tmp_path: Path) -> None:
    """Once a dataset's chunk views are memoised, the Python lines a gather runs do not grow with
    the chunks the message touches (wide rows, small rows, several shards): the per-chunk work is
    in C loops and numpy calls (the old code ran a few Python lines per chunk and column: ~5 per
    chunk here), the GIL-held part of a shuffled message."""
    width = 16 << 10
    tensor = pa.fixed_shape_tensor(pa.uint8(), [width])
    schema = pa.schema([("image", tensor), ("label", pa.int64())])
    for s in range(2):  # (the sink closed here: a file still open for writing is not memory-mapped)
        with pa.OSFile(str(tmp_path / f"part-{s:05d}.arrow"), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for c in range(40):  # 40 chunks of 4 rows per shard
                first = (s * 40 + c) * 4
                flat = pa.array(np.full(4 * width, first // 4 % 256, dtype=np.uint8))
                writer.write_batch(pa.record_batch([
                    pa.ExtensionArray.from_storage(tensor, pa.FixedSizeListArray.from_arrays(flat, width)),
                    pa.array(np.arange(first, first + 4, dtype=np.int64)),
                ], schema=schema))
    ds = open_dataset("chunky", str(tmp_path))
    assert ds.num_chunks == 80 and all(shard.zero_copy for shard in ds.shards)
    gather(ds, np.arange(ds.num_rows, dtype=np.int64), None)  # every chunk's views memoised

    def lines_for(rows: np.ndarray[Any, np.dtype[np.int64]]) -> int:
        batch, lines = _traced_gather(ds, rows)
        assert np.array_equal(batch.column("label").to_numpy(), rows)
        column: Any = batch.column("image")
        pixels = np.asarray(column.storage.flatten()).reshape(len(rows), width)
        assert (pixels == (rows // 4 % 256).astype(np.uint8)[:, None]).all()
        return lines

    rng = np.random.default_rng(3)
    # 64 rows each: from 4 chunks of one shard, then from 64 chunks of both shards
    few = lines_for(rng.permutation(np.arange(16, 32, dtype=np.int64).repeat(4)))
    many = lines_for(rng.permutation(np.arange(0, 320, 5, dtype=np.int64)))
    assert many <= few + 10, (few, many)
    ds.close()


def test_a_message_over_more_shards_than_may_be_held_is_copied_a_chunk_at_a_time(
    typed: tuple[Dataset, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a small open-shard bound the message's chunks are not all held at once: the same rows."""
    ds, table = typed
    monkeypatch.setattr(gather_module, "_PIN_SHARE", 1 << 30)  # at most one shard held at once
    calls: list[int] = []
    monkeypatch.setattr(gather_module, "gather_fixed", lambda *a: calls.append(1))
    rows = np.random.default_rng(5).permutation(table.num_rows)[:200].astype(np.int64)
    _same(gather(ds, rows, None), table.take(rows))
    assert not calls  # the one-copy path (which holds every chunk) was not taken


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_type_travels_bit_exact_through_a_server(typed: tuple[Dataset, pa.Table], shuffle: bool) -> None:
    """Raw Flight reads of every stream of an epoch, stored and shuffled: each row (found by its
    ``index``) equals the stored row, every row exactly once."""
    import pyarrow.flight as flight

    from flightfeed.server.testing import running_server
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand

    ds, table = typed
    with running_server({"typed": ds.uri}) as srv:
        cmd = ReadCommand(version=WIRE_VERSION, dataset="typed", world_size=1, batch_rows=8, streams=3, num_workers=1)
        cmd.shuffle.enabled = shuffle
        client = flight.FlightClient(srv.location)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        got = pa.Table.from_batches(
            [b for ep in info.endpoints for b in client.do_get(ep.ticket).read_all().to_batches()]
        )
        client.close()
    index = got.column("index").to_numpy()
    assert np.array_equal(np.sort(index), np.arange(table.num_rows))
    if shuffle:
        assert not np.array_equal(index, np.arange(table.num_rows))
    _same(got.combine_chunks().to_batches()[0], table.take(index))
