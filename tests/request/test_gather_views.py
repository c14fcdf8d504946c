"""Views on the wire, the server's half (docs/wire-views.md): a shuffled message's wide fixed-width
columns are ``binary_view`` columns whose data buffers are runs of the stored pages (no copy), one
buffer per run of consecutive stored rows; narrow columns are copied as before; the wire schema
carries each view column's plain field, which the client's ``plain_column`` turns back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flightfeed.client._receive.views import plain_batch
from flightfeed.server.request.gather import gather
from flightfeed.server.request.view_rows import as_view, to_wire
from flightfeed.server.storage import open_dataset
from flightfeed.wire.views import VIEW_OF, fixed_layout, plain_field, view_fields, wire_field, wire_schema
from tests.support.wide_data import IMAGE_BYTES, WIDE_ROWS, WIDE_SCHEMA, check_wide_table, write_wide_dataset

VIEWED = {"image", "odd", "vec"}


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wide")
    write_wide_dataset(root)
    return root


def _rows() -> np.ndarray:
    rows = np.random.default_rng(5).permutation(WIDE_ROWS)[:100].astype(np.int64)
    rows[20:30] = np.arange(45, 55)  # a run of ten consecutive stored rows of one chunk
    return rows


def test_the_wire_schema_makes_wide_fixed_columns_views_and_gives_their_fields_back() -> None:
    wire = wire_schema(WIDE_SCHEMA)
    assert {f.name for f in wire if pa.types.is_binary_view(f.type)} == VIEWED
    for f in wire:
        if f.name in VIEWED:
            assert VIEW_OF in (f.metadata or {})
            assert plain_field(f) == WIDE_SCHEMA.field(f.name)
            assert plain_field(f).metadata == WIDE_SCHEMA.field(f.name).metadata  # type: ignore[union-attr]
        else:
            assert f.equals(WIDE_SCHEMA.field(f.name), check_metadata=True)
    assert [i for i, _ in view_fields(wire)] == [0, 1, 2]
    assert wire_schema(pa.schema([("label", pa.int64())])) == pa.schema([("label", pa.int64())])
    # a binary_view column of a dataset (no view metadata) is no view column
    assert plain_field(pa.field("b", pa.binary_view())) is None


def test_a_shuffled_message_sends_views_of_the_stored_pages(wide_dir: Path) -> None:
    ds = open_dataset("wide", str(wide_dir))
    rows = _rows()
    batch = gather(ds, rows, None, views=True)
    batch.validate(full=True)  # prefixes, buffer indices and offsets are valid views
    assert batch.schema == wire_schema(WIDE_SCHEMA)
    image: Any = batch.column("image")
    data = image.buffers()[2:]
    # one data buffer per run of consecutive stored rows: 100 rows, one run of ten
    runs = 1 + int(((np.diff(rows) != 1) | (np.diff(ds.locate(rows)[0]) != 0)).sum())
    assert len(data) == runs < 100
    # each buffer is the chunk's own memory (zero-copy), not a copy
    cid, local = ds.locate(rows)
    chunk: Any = ds.chunk(int(cid[0])).column("image")
    base = chunk.storage.values.buffers()[1].address + chunk.storage.values.offset
    assert data[0].address == base + int(local[0]) * IMAGE_BYTES
    assert batch.column("small").type == WIDE_SCHEMA.field("small").type  # narrow rows: copied
    # the client's half turns it into exactly the plain gather
    check_wide_table(plain_batch(batch), rows.tolist())
    assert plain_batch(batch).equals(gather(ds, rows, None))
    ds.close()


def test_views_of_a_message_touching_one_chunk_and_an_empty_message(wide_dir: Path) -> None:
    ds = open_dataset("wide", str(wide_dir))
    rows = np.arange(10, 30, dtype=np.int64)[::-1].copy()
    batch = gather(ds, rows, ["odd", "index"], views=True)
    assert pa.types.is_binary_view(batch.schema.field("odd").type)
    check_wide_table_cols = plain_batch(batch)
    assert np.asarray(check_wide_table_cols.column("index")).tolist() == rows.tolist()
    assert check_wide_table_cols.column("odd").equals(gather(ds, rows, ["odd"]).column("odd"))
    empty = gather(ds, np.empty(0, np.int64), None, views=True)
    assert empty.num_rows == 0 and empty.schema == wire_schema(WIDE_SCHEMA)
    assert plain_batch(empty).schema.equals(WIDE_SCHEMA, check_metadata=False)
    ds.close()


def test_a_plain_column_with_null_rows_travels_as_views_with_its_nulls() -> None:
    t = pa.list_(pa.uint8(), 1 << 14)
    values = (np.arange(3 << 14) % 251).astype(np.uint8)
    plain: Any = pa.FixedSizeListArray.from_arrays(pa.array(values), 1 << 14, mask=pa.array([False, True, False]))
    layout = fixed_layout(t)
    assert layout is not None
    view = as_view(plain, layout)
    view.validate(full=True)
    assert view.null_count == 1
    schema = pa.schema([("b", t)])
    wire = to_wire(pa.record_batch([plain], schema=schema), wire_schema(schema))
    back: Any = plain_batch(wire).column("b")
    assert back.type == t and back.to_pylist() == plain.to_pylist()


def test_rows_under_the_view_size_stay_plain() -> None:
    assert wire_field(pa.field("ids", pa.int64())) == pa.field("ids", pa.int64())
    assert wire_field(pa.field("emb", pa.list_(pa.float32(), 4095))).type == pa.list_(pa.float32(), 4095)
    assert pa.types.is_binary_view(wire_field(pa.field("emb", pa.list_(pa.float32(), 4096))).type)


def test_view_schemas_that_differ_only_in_their_plain_types_are_told_apart() -> None:
    """Arrow schemas compare equal without their metadata: the memo of view columns must not hand
    one dataset's plain type to another's view column (seen: 16 KiB rows read as 150,528-byte ones)."""
    big = wire_schema(pa.schema([("image", pa.list_(pa.uint8(), 150_528))]))
    small = wire_schema(pa.schema([("image", pa.list_(pa.uint8(), 16_384))]))
    assert big == small  # the trap
    assert view_fields(big)[0][1].type == pa.list_(pa.uint8(), 150_528)
    assert view_fields(small)[0][1].type == pa.list_(pa.uint8(), 16_384)


def test_views_of_inflated_hdf5_chunks(tmp_path: Path) -> None:
    """A gzip HDF5 dataset's shuffled rows travel as views of its inflated chunks (the chunk
    cache's arrays), byte for byte the plain gather's."""
    import h5py

    rows = 96
    index = np.arange(rows, dtype=np.int64)
    image = ((index[:, None] * 5 + np.arange(1 << 14)[None, :]) % 249).astype(np.uint8).reshape(rows, 64, 64, 4)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("image", data=image, chunks=(8, 64, 64, 4), compression="gzip")
        f.create_dataset("index", data=index, chunks=(8,), compression="gzip")
    ds = open_dataset("h", str(tmp_path / "d.h5"))
    order = np.random.default_rng(2).permutation(rows).astype(np.int64)[:40]
    batch = gather(ds, order, None, views=True)
    batch.validate(full=True)
    column: Any = batch.column("image")
    assert pa.types.is_binary_view(column.type) and len(column.buffers()) > 3
    plain = plain_batch(batch)
    assert plain.equals(gather(ds, order, None))
    images: Any = plain.column("image")
    assert (np.asarray(images.storage.flatten()).reshape(len(order), 64, 64, 4) == image[order]).all()
    ds.close()


def test_views_enter_the_shared_message_identity_only_for_shuffled_view_reads() -> None:
    """A view message and a plain one are different RecordBatches: requests share messages
    (request/shared_messages.py) only when they agree on views; an absent views (and a stored
    order read, whose messages are plain either way) keeps the former identity."""
    from types import SimpleNamespace

    from flightfeed.server.request.request_identity import request_identity
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand

    ds = SimpleNamespace(name="d", fingerprint="f", num_rows=10)

    def read(views: bool, shuffle: bool) -> Any:
        cmd = ReadCommand(version=WIRE_VERSION, dataset="d", world_size=1, batch_rows=1, views=views)
        cmd.shuffle.enabled = shuffle
        return cmd

    assert request_identity(ds, read(True, True)) != request_identity(ds, read(False, True))
    assert "views" not in request_identity(ds, read(False, True))
    assert request_identity(ds, read(True, False)) == request_identity(ds, read(False, False))


def test_a_plain_column_past_a_views_offset_range_is_cut_into_buffers() -> None:
    """A view's offset is an int32: a plain column of more than 2 GiB (here: more than a small
    ``max_span``) is wrapped in several data buffers, each under it, still without a copy."""
    t = pa.list_(pa.uint8(), 1 << 14)
    layout = fixed_layout(t)
    assert layout is not None
    values = (np.arange(10 << 14) % 253).astype(np.uint8)
    plain: Any = pa.FixedSizeListArray.from_arrays(pa.array(values), 1 << 14)
    view = as_view(plain, layout, max_span=3 << 14)  # three rows a buffer
    view.validate(full=True)
    data = view.buffers()[2:]
    assert [b.size for b in data] == [3 << 14, 3 << 14, 3 << 14, 1 << 14]
    assert data[0].address == plain.values.buffers()[1].address  # the column's own memory
    schema = pa.schema([("b", t)])
    back: Any = plain_batch(pa.record_batch([view], schema=wire_schema(schema))).column("b")
    assert back.equals(plain)


def test_decoded_chunks_held_by_views_in_flight_count_against_the_chunk_cache(tmp_path: Path) -> None:
    """A view message keeps its inflated HDF5 chunks alive until it is let go: chunks evicted
    meanwhile still count against ``--chunk-cache`` (``held_bytes``), other chunks are evicted in
    their place, and the bytes come back once the message is gone."""
    import gc

    import h5py

    from flightfeed.server.storage import StorageOptions

    rows = 1024
    image = np.arange(rows * (1 << 14), dtype=np.int64).astype(np.uint8).reshape(rows, 1 << 14)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("image", data=image, chunks=(8, 1 << 14), compression="gzip")
    probe = open_dataset("probe", str(tmp_path / "d.h5"))
    per_chunk = int(probe.chunk_starts[1])  # rows of a served chunk (runs of HDF5 chunks)
    probe.close()
    chunk_bytes = per_chunk * (1 << 14)
    ds = open_dataset("h", str(tmp_path / "d.h5"), StorageOptions(chunk_cache_bytes=4 * chunk_bytes))
    assert ds.num_chunks >= 8
    cache = ds.chunk_cache
    picked = np.array([3, per_chunk + 1, 2 * per_chunk + 5, 3 * per_chunk + 7], dtype=np.int64)  # chunks 0-3
    in_flight = gather(ds, picked, ["image"], views=True)
    assert cache.held_bytes == 0 and cache.nbytes == 4 * chunk_bytes
    for r in range(4 * per_chunk, rows, per_chunk):  # the other chunks, read while the message is in flight
        gather(ds, np.array([r], dtype=np.int64), ["image"], views=True)
        assert cache.nbytes + cache.held_bytes <= cache.max_bytes + chunk_bytes  # (one chunk is always kept)
    assert cache.held_bytes == 4 * chunk_bytes  # the message's four chunks, evicted but referenced
    assert cache.nbytes <= chunk_bytes  # kept within the budget by evicting the others
    plain = plain_batch(in_flight)
    got: Any = plain.column("image")
    values = got.storage.flatten() if hasattr(got, "storage") else got.flatten()
    assert (np.asarray(values).reshape(4, -1) == image[picked]).all()
    del in_flight, plain, got, values
    gc.collect()
    assert cache.held_bytes == 0
    assert cache.figures()["held_bytes"] == 0
    ds.close()
