"""``flightfeed convert --from lmdb|tfrecord``: sources written by the ``lmdb`` + ``msgpack`` and
``tfrecord`` packages come back bit-exact through serve -> FlightDataset; an LMDB ImageNet is a
served ImageNet with the imagenet transforms; damaged or pickled inputs are refused by name."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import ConfigError, DatasetError
from tests.convert.format_roundtrip import arrow_rows, convert_to, jpeg, served_rows

lmdb = pytest.importorskip("lmdb", reason="lmdb is not installed (pip install lmdb msgpack)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")


def write_lmdb(
    path: Path, n: int, *, length: bytes | None = b"auto", extra: dict[bytes, bytes] | None = None
) -> list[tuple[bytes, int]]:
    """The seed recipe's layout: msgpack'd (jpeg_bytes, label) under "0".."N-1", N under __len__."""
    records = [(jpeg(i, 48 + i % 5, 40), i % 10) for i in range(n)]
    env = lmdb.open(str(path), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i, (image, label) in enumerate(records):
            txn.put(str(i).encode(), msgpack.packb((image, label), use_bin_type=True))
        if length == b"auto":
            txn.put(b"__len__", msgpack.packb(n))
        elif length is not None:
            txn.put(b"__len__", length)
        for key, value in (extra or {}).items():
            txn.put(key, value)
    env.close()
    return records


def test_lmdb_recipe_layout_round_trip(tmp_path: Path) -> None:
    records = write_lmdb(tmp_path / "train.lmdb", 23)
    manifest = convert_to(tmp_path / "train.lmdb", tmp_path / "out", "auto")
    assert manifest.rows == 23 and manifest.extra["lmdb"] == {"decoder": "msgpack"}
    got = served_rows(tmp_path / "out")
    assert got["image"] == [r[0] for r in records]  # row i is key "i" (not the cursor's "0","1","10",...)
    assert got["label"] == [r[1] for r in records]


def test_lmdb_ascii_len_and_raw_decoder(tmp_path: Path) -> None:
    write_lmdb(tmp_path / "a", 12, length=b"12")
    assert convert_to(tmp_path / "a", tmp_path / "out", "lmdb").rows == 12
    manifest = convert_to(tmp_path / "a", tmp_path / "raw", "lmdb", lmdb_decoder="raw")
    got = served_rows(tmp_path / "raw")
    env = lmdb.open(str(tmp_path / "a"), readonly=True, lock=False)
    with env.begin() as txn:
        expected = [(k, v) for k, v in txn.cursor() if not (k.startswith(b"__") and k.endswith(b"__"))]
    assert manifest.rows == 12 and list(zip(got["key"], got["value"], strict=True)) == expected


def test_raw_keeps_keys_that_only_start_with_two_underscores(tmp_path: Path) -> None:
    """--lmdb-decoder raw leaves out the recipes' __dunder__ keys only, not a record's key that
    starts with ``__`` (it was dropped silently)."""
    env = lmdb.open(str(tmp_path / "a"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for key in (b"__0001", b"__len__", b"__keys__", b"_a", b"b", b"__"):
            txn.put(key, key[::-1])
    env.close()
    manifest = convert_to(tmp_path / "a", tmp_path / "raw", "lmdb", lmdb_decoder="raw")
    got = arrow_rows(tmp_path / "raw")
    assert manifest.rows == 4 and got.column("key").to_pylist() == [b"__", b"__0001", b"_a", b"b"]
    assert got.column("value").to_pylist() == [b"__", b"1000__", b"a_", b"b"]


def test_lmdb_without_len_is_refused(tmp_path: Path) -> None:
    write_lmdb(tmp_path / "a", 5, length=None)
    with pytest.raises(DatasetError, match=r"a: no __len__ key"):
        convert_to(tmp_path / "a", tmp_path / "out", "lmdb")
    write_lmdb(tmp_path / "b", 5, length=b"7")
    with pytest.raises(DatasetError, match=r"__len__ says 7 but the database holds 5 records"):
        convert_to(tmp_path / "b", tmp_path / "out", "lmdb")


def test_a_pickled_lmdb_value_is_refused_in_every_mode(tmp_path: Path) -> None:
    write_lmdb(tmp_path / "a", 5, extra={b"3": pickle.dumps((b"jpeg", 3), protocol=4)})
    for decoder in ("msgpack", "raw"):
        with pytest.raises(ConfigError, match=r"key '3' holds a pickled value; flightfeed never unpickles"):
            convert_to(tmp_path / "a", tmp_path / f"out-{decoder}", "lmdb", lmdb_decoder=decoder, on_bad_record="skip")
    with pytest.raises(ConfigError, match="pickle is refused"):
        convert_to(tmp_path / "a", tmp_path / "out", "lmdb", lmdb_decoder="pickle")


def test_lmdb_imagenet_is_served_with_the_imagenet_transforms(tmp_path: Path) -> None:
    from flightfeed.client import FlightDataset, ReadOptions
    from flightfeed.server.testing import running_server

    write_lmdb(tmp_path / "imagenet", 12)
    convert_to(tmp_path / "imagenet", tmp_path / "out", "lmdb")
    with running_server({"imagenet": str(tmp_path / "out")}) as server:
        for preset in ("imagenet_train", "imagenet_val"):
            ds = FlightDataset(
                server.location,
                "imagenet",
                batch_size=4,
                transform=preset,
                options=ReadOptions(streams=1, report_interval=None),
            )
            batches = list(ds)
            assert sum(len(b["label"]) for b in batches) == 12
            image = batches[0]["image"]
            assert str(image.dtype) == "torch.uint8" and tuple(image.shape[1:]) in ((224, 224, 3), (3, 224, 224))


tfrecord = pytest.importorskip("tfrecord", reason="tfrecord is not installed (pip install tfrecord)")


def write_tfrecord(path: Path, n: int, start: int = 0) -> list[dict[str, object]]:
    from tfrecord import TFRecordWriter

    rows = []
    writer = TFRecordWriter(str(path))
    for i in range(start, start + n):
        row = {
            "image": jpeg(i),
            "label": i - 5,
            "score": float(np.float32(i / 3)),
            "vec": [float(i), -1.5, 2.25][: i % 4],
            "ids": list(range(i % 5)),
            "big": 2**40 + i,
        }
        writer.write(
            {
                "image": (row["image"], "byte"),
                "label": (row["label"], "int"),
                "score": (row["score"], "float"),
                "vec": (row["vec"], "float"),
                "ids": (row["ids"], "int"),
                "big": (row["big"], "int"),
            }
        )
        rows.append(row)
    writer.close()
    return rows


def test_tfrecord_round_trip_plain_and_gzip(tmp_path: Path) -> None:
    rows = write_tfrecord(tmp_path / "a.tfrecord", 9) + write_tfrecord(tmp_path / "b.tfrecord", 7, start=9)
    (tmp_path / "b.tfrecord.gz").write_bytes(gzip.compress((tmp_path / "b.tfrecord").read_bytes()))
    (tmp_path / "b.tfrecord").unlink()
    manifest = convert_to(tmp_path, tmp_path / "out", "auto")
    assert manifest.rows == 16
    types = {f.name: str(f.type) for f in manifest.schema}
    assert types == {
        "big": "int64",
        "ids": "list<item: int64>",
        "image": "binary",
        "label": "int64",
        "score": "float",
        "vec": "list<item: float>",
    }
    got = served_rows(tmp_path / "out", ["image", "label", "score", "big"])
    for name in ("image", "label", "score", "big"):
        assert got[name] == [r[name] for r in rows], name

    table = arrow_rows(tmp_path / "out")  # list columns: checked at the Arrow level
    assert table.column("vec").to_pylist() == [r["vec"] for r in rows]
    assert table.column("ids").to_pylist() == [r["ids"] for r in rows]


def test_a_bad_tfrecord_crc_is_refused_naming_file_and_offset(tmp_path: Path) -> None:
    write_tfrecord(tmp_path / "a.tfrecord", 6)
    data = bytearray((tmp_path / "a.tfrecord").read_bytes())
    # the third record's offset: walk the framing
    offset = 0
    for _ in range(2):
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    data[offset + 12 + 20] ^= 0xFF  # a byte of the third record's data
    (tmp_path / "a.tfrecord").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"a\.tfrecord at byte {offset}: data CRC mismatch"):
        convert_to(tmp_path, tmp_path / "out", "tfrecord")
    manifest = convert_to(tmp_path, tmp_path / "out2", "tfrecord", on_bad_record="skip")
    assert manifest.rows == 5 and manifest.extra["bad_records"]["skipped"] == 1
    data[8] ^= 0x01  # the first length's CRC: nothing after it can be found
    (tmp_path / "a.tfrecord").write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"a\.tfrecord at byte 0: length CRC mismatch"):
        convert_to(tmp_path, tmp_path / "out3", "tfrecord")


def test_s3_to_s3_for_tfrecord_and_lmdb(s3: LocalS3, tmp_path: Path) -> None:
    """SRC and DST on S3 (moto in server mode on 127.0.0.1): detection, download, upload."""
    from flightfeed.server.storage import open_dataset
    from flightfeed.server.tools.convert import ConvertSettings, convert

    (tmp_path / "src").mkdir()
    rows = write_tfrecord(tmp_path / "src" / "a.tfrecord", 8) + write_tfrecord(tmp_path / "src" / "b.tfrecord", 5, 8)
    bucket = s3.new_bucket()
    s3.upload_dir(tmp_path / "src", f"s3://{bucket}/tfr")
    settings = ConvertSettings(progress=False, storage=s3.options())
    manifest = convert(f"s3://{bucket}/tfr", f"s3://{bucket}/out", settings)  # --from auto on S3
    assert manifest.rows == 13 and manifest.extra["source_kind"] == "TFRecord (2 file(s))"
    ds = open_dataset("d", f"s3://{bucket}/out", s3.options(tmp_path / "cache"))
    try:
        table = pa.Table.from_batches([ds.chunk(c) for c in range(ds.num_chunks)], schema=ds.schema)
    finally:
        ds.close()
    assert table.column("image").to_pylist() == [r["image"] for r in rows]
    assert table.column("label").to_pylist() == [r["label"] for r in rows]
    records = write_lmdb(tmp_path / "lmdb", 6)
    s3.upload_dir(tmp_path / "lmdb", f"s3://{bucket}/lmdb")
    manifest = convert(
        f"s3://{bucket}/lmdb",
        str(tmp_path / "lmdb-out"),
        ConvertSettings(progress=False, kind="lmdb", storage=s3.options()),
    )
    assert served_rows(tmp_path / "lmdb-out", ["image"])["image"] == [r[0] for r in records]


def test_files_that_are_not_tfrecords_or_tars_are_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.tfrecord").write_bytes(b"this is not a tfrecord file at all" * 3)
    with pytest.raises(DatasetError, match=r"x\.tfrecord at byte 0: length CRC mismatch"):
        convert_to(tmp_path / "t", tmp_path / "out", "tfrecord")
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "x.tar").write_bytes(b"garbage" * 100)
    with pytest.raises(DatasetError, match=r"x\.tar at byte 0: tar header checksum mismatch"):
        convert_to(tmp_path / "w", tmp_path / "out", "webdataset")


def test_a_first_tfrecord_without_an_optional_feature_is_the_bad_record(tmp_path: Path) -> None:
    """The columns are the features most of the first records have: a first record lacking one
    (an optional feature) is the bad record, not every record after it."""
    from tfrecord import TFRecordWriter

    writer = TFRecordWriter(str(tmp_path / "a.tfrecord"))
    writer.write({"label": (0, "int")})  # no "box"
    for i in range(1, 6):
        writer.write({"label": (i, "int"), "box": ([i / 2, 1.0, 2.0, 3.0], "float")})
    writer.close()
    with pytest.raises(DatasetError, match=r"a\.tfrecord at byte 0: features differ \(missing \['box'\]"):
        convert_to(tmp_path, tmp_path / "out", "tfrecord")
    manifest = convert_to(tmp_path, tmp_path / "out2", "tfrecord", on_bad_record="skip")
    assert manifest.rows == 5 and manifest.extra["bad_records"]["skipped"] == 1
    table = arrow_rows(tmp_path / "out2")
    assert table.column("label").to_pylist() == [1, 2, 3, 4, 5]
    assert table.column("box").to_pylist() == [[i / 2, 1.0, 2.0, 3.0] for i in range(1, 6)]


def test_lmdb_maps_with_their_keys_in_another_order_are_the_same_record(tmp_path: Path) -> None:
    """msgpack maps are maps: a record whose dict was built in another key order converts (it was
    a bad record), and one whose value has another type is named for that."""
    env = lmdb.open(str(tmp_path / "m"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i in range(6):
            record = {"image": bytes([i]) * 3, "label": i, "caption": f"c{i}"}
            if i % 2:
                record = dict(reversed(list(record.items())))
            txn.put(str(i).encode(), msgpack.packb(record, use_bin_type=True))
        txn.put(b"6", msgpack.packb({"image": b"x", "label": "seven", "caption": "c"}, use_bin_type=True))
        txn.put(b"__len__", b"7")
    env.close()
    with pytest.raises(DatasetError, match=r"key '6': value types \['bytes', 'str', 'str'\] differ .*'int'"):
        convert_to(tmp_path / "m", tmp_path / "out", "lmdb")
    manifest = convert_to(tmp_path / "m", tmp_path / "out2", "lmdb", on_bad_record="skip")
    table = arrow_rows(tmp_path / "out2")
    assert manifest.rows == 6 and table.column_names == ["image", "label", "caption"]
    assert table.column("label").to_pylist() == list(range(6))
    assert table.column("caption").to_pylist() == [f"c{i}" for i in range(6)]
    assert table.column("image").to_pylist() == [bytes([i]) * 3 for i in range(6)]
