"""The convert sources hand bytes on as views into their own mappings (an LMDB's map, a mapped
tar shard, a TFRecord's record) and copy them once, into the record batch: values stay bit-exact
when a batch spans several source files (views outlive their file's ``with`` block), the LMDB
recipe's ``[bin, int]`` fast path agrees with msgpack for every encoding and refuses nothing that
msgpack would accept, and records outside it are judged exactly as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flightfeed.wire.errors import DatasetError
from tests.convert.format_roundtrip import arrow_rows, convert_to

lmdb = pytest.importorskip("lmdb", reason="lmdb is not installed (pip install lmdb msgpack)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")

LABELS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40, 2**63 - 1,
          -1, -32, -33, -128, -129, -40000, -(2**31) - 1, -(2**63)]
SIZES = [0, 1, 255, 256, 65535, 65536, 70001]  # bin8, bin16, bin32


def test_the_recipe_fast_path_agrees_with_msgpack() -> None:
    from flightfeed.server.tools.convert.sources.from_lmdb import recipe_pair

    for size in SIZES:
        for label in LABELS:
            image = os.urandom(size)
            got = recipe_pair(memoryview(msgpack.packb((image, label), use_bin_type=True)))
            assert got is not None and (bytes(got[0]), got[1]) == (image, label), (size, label)
    for other in [(b"x", 1.5), (b"x", True), (b"x", None), ("text", 1), (b"x",), (b"x", 1, 2), {"image": b"x"}]:
        assert recipe_pair(memoryview(msgpack.packb(other, use_bin_type=True))) is None, other
    whole = msgpack.packb((b"abc", 7), use_bin_type=True)
    for damaged in (whole + b"\x00", whole[:-1], whole[:4], b"\x92\xc6\xff\xff\xff\xff\x01"):
        assert recipe_pair(memoryview(damaged)) is None, damaged


def _lmdb(path: Path, values: list[bytes]) -> None:
    env = lmdb.open(str(path), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i, value in enumerate(values):
            txn.put(str(i).encode(), value)
        txn.put(b"__len__", msgpack.packb(len(values)))
    env.close()


def test_lmdb_every_encoding_round_trips_in_batches(tmp_path: Path) -> None:
    records = [(os.urandom(SIZES[i % len(SIZES)]), label) for i, label in enumerate(LABELS * 2)]
    _lmdb(tmp_path / "db", [msgpack.packb(r, use_bin_type=True) for r in records])
    manifest = convert_to(tmp_path / "db", tmp_path / "out", "lmdb", rows_per_batch=3, shard_bytes=100_000)
    assert manifest.rows == len(records) and len(manifest.shards) > 1
    table = arrow_rows(tmp_path / "out")
    assert table.column("image").to_pylist() == [r[0] for r in records]
    assert table.column("label").to_pylist() == [r[1] for r in records]


def test_lmdb_records_outside_the_fast_path_are_judged_as_before(tmp_path: Path) -> None:
    good = [msgpack.packb((os.urandom(300), i), use_bin_type=True) for i in range(6)]
    values = [*good[:2], msgpack.packb((b"img", 2.5), use_bin_type=True), good[3] + b"\x00", *good[4:]]
    _lmdb(tmp_path / "db", values)
    with pytest.raises(DatasetError, match=r"key '2'.*differ from the first record's"):
        convert_to(tmp_path / "db", tmp_path / "out", "lmdb")
    manifest = convert_to(tmp_path / "db", tmp_path / "skip", "lmdb", on_bad_record="skip")
    assert manifest.rows == 4
    bad = manifest.extra["bad_records"]
    db = tmp_path / "db"
    assert bad["skipped"] == 2 and sorted(bad["named"]) == [f"{db}: key '2'", f"{db}: key '3'"]
    assert "not a msgpack value" in bad["named"][f"{db}: key '3'"]
    assert arrow_rows(tmp_path / "skip").column("label").to_pylist() == [0, 1, 4, 5]


def test_webdataset_batches_spanning_shards_are_bit_exact(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset", reason="webdataset is not installed")
    expected = []
    for s in range(4):
        with wds.TarWriter(str(tmp_path / f"train-{s:06d}.tar")) as sink:
            for i in range(5):
                n = s * 5 + i
                sample = {"__key__": f"{n:06d}", "jpg": os.urandom(1000 + n), "cls": n % 7, "txt": f"t{n}"}
                sink.write(sample)
                expected.append(sample)
    convert_to(tmp_path, tmp_path / "out", "webdataset", rows_per_batch=7)
    table = arrow_rows(tmp_path / "out")
    assert table.column("jpg").to_pylist() == [s["jpg"] for s in expected]
    assert table.column("cls").to_pylist() == [s["cls"] for s in expected]
    assert table.column("txt").to_pylist() == [s["txt"] for s in expected]


def test_tfrecord_batches_spanning_files_and_bytes_lists(tmp_path: Path) -> None:
    tfrecord = pytest.importorskip("tfrecord", reason="tfrecord is not installed")
    rows = []
    for f in range(3):
        writer = tfrecord.TFRecordWriter(str(tmp_path / f"part-{f}.tfrecord"))
        for i in range(5):
            row = {"image": os.urandom(500 + 10 * f + i), "tags": [os.urandom(3), os.urandom(i + 1)], "n": f * 5 + i}
            writer.write({"image": (row["image"], "byte"), "tags": (row["tags"], "byte"), "n": (row["n"], "int")})
            rows.append(row)
        writer.close()
    convert_to(tmp_path, tmp_path / "out", "tfrecord", rows_per_batch=4)
    table = arrow_rows(tmp_path / "out")
    assert str(table.schema.field("tags").type) == "list<item: binary>"
    assert table.column("image").to_pylist() == [r["image"] for r in rows]
    assert table.column("tags").to_pylist() == [r["tags"] for r in rows]
    assert table.column("n").to_pylist() == [r["n"] for r in rows]
