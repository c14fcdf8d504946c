"""``flightfeed convert --from webdataset``: tar shards written by ``webdataset.TarWriter`` come
back bit-exact through serve -> FlightDataset; damaged shards are refused naming shard and
member, or skipped and counted."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import ConfigError, DatasetError
from tests.convert.format_roundtrip import convert_to, jpeg, served_rows

wds = pytest.importorskip("webdataset", reason="webdataset is not installed (pip install webdataset)")


def write_shards(root: Path, shards: int = 3, per: int = 5) -> list[dict[str, object]]:
    samples = []
    for s in range(shards):
        with wds.TarWriter(str(root / f"train-{s:06d}.tar")) as sink:
            for i in range(per):
                n = s * per + i
                sample = {
                    "__key__": f"s{s}/{n:06d}",
                    "jpg": jpeg(n),
                    "cls": n % 4,
                    "txt": f"caption {n} é",
                    "json": {"n": n, "tags": ["a"] * (n % 3)},
                }
                sink.write(sample)
                samples.append(sample)
    return samples


def test_webdataset_round_trip_is_bit_exact(tmp_path: Path) -> None:
    samples = write_shards(tmp_path)
    (tmp_path / "train-000099.tar").write_bytes(b"")  # not named by the pattern: not read
    manifest = convert_to(tmp_path / "train-{000000..000002}.tar", tmp_path / "out", "webdataset")
    assert manifest.rows == 15 and manifest.extra["bad_records"] == {"policy": "error", "skipped": 0, "named": {}}
    assert [f.name for f in manifest.schema] == ["__key__", "cls", "jpg", "json", "txt"]
    got = served_rows(tmp_path / "out")
    assert got["__key__"] == [s["__key__"] for s in samples]
    assert got["jpg"] == [s["jpg"] for s in samples]
    assert got["cls"] == [s["cls"] for s in samples]
    assert got["txt"] == [s["txt"] for s in samples]
    assert [json.loads(t) for t in got["json"]] == [s["json"] for s in samples]


def test_webdataset_detected_by_auto(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=1)
    manifest = convert_to(tmp_path, tmp_path / "out", "auto")
    assert manifest.rows == 5 and manifest.extra["source_kind"] == "WebDataset (1 shard(s))"


def _truncate_last_member(path: Path) -> None:
    data = path.read_bytes()
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    path.write_bytes(data[: last.offset_data + last.size // 2])


def test_a_truncated_member_is_refused_naming_shard_and_member(tmp_path: Path) -> None:
    write_shards(tmp_path, shards=2)
    _truncate_last_member(tmp_path / "train-000001.tar")
    with pytest.raises(DatasetError, match=r"train-000001\.tar: member s1/000009\.txt at byte \d+: truncated"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skip_leaves_out_and_counts_the_damaged_sample(tmp_path: Path) -> None:
    samples = write_shards(tmp_path, shards=2)
    _truncate_last_member(tmp_path / "train-000001.tar")
    manifest = convert_to(tmp_path, tmp_path / "out", "webdataset", on_bad_record="skip")
    assert manifest.rows == 9
    bad = manifest.extra["bad_records"]
    assert isinstance(bad, dict) and bad["skipped"] == 2  # the cut sample, and the damaged shard's framing
    assert any("s1/000009" in where for where in bad["named"])
    assert served_rows(tmp_path / "out", ["__key__"])["__key__"] == [s["__key__"] for s in samples[:9]]


def test_a_sample_missing_a_member_is_a_named_bad_record(tmp_path: Path) -> None:
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": b"x", "cls": 1})
        sink.write({"__key__": "k1", "jpg": b"y"})
        sink.write({"__key__": "k2", "jpg": b"z", "cls": 2})
    with pytest.raises(DatasetError, match=r"a\.tar: sample k1: members differ .*missing \['cls'\]"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(tmp_path, tmp_path / "out2", "webdataset", on_bad_record="skip")
    assert manifest.rows == 2 and manifest.extra["bad_records"]["skipped"] == 1


def test_an_odd_first_sample_does_not_make_every_other_sample_bad(tmp_path: Path) -> None:
    """The columns are the members most of the first samples have: a first sample missing one
    member (or with an extra one) is the bad record, not every sample after it."""
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": b"x"})  # no .cls
        for i in range(1, 6):
            sink.write({"__key__": f"k{i}", "jpg": bytes([i]), "cls": i})
        sink.write({"__key__": "k6", "jpg": b"y", "cls": 6, "txt": "extra"})
    with pytest.raises(DatasetError, match=r"a\.tar: sample k0: members differ .*missing \['cls'\]"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(tmp_path, tmp_path / "out2", "webdataset", on_bad_record="skip")
    assert [f.name for f in manifest.schema] == ["__key__", "cls", "jpg"]
    assert manifest.extra["bad_records"]["skipped"] == 2
    got = served_rows(tmp_path / "out2")
    assert got["__key__"] == [f"k{i}" for i in range(1, 6)] and got["cls"] == [1, 2, 3, 4, 5]
    assert got["jpg"] == [bytes([i]) for i in range(1, 6)]


def test_large_samples_after_small_ones_keep_batches_and_shards_near_their_size(tmp_path: Path) -> None:
    """Rows per batch come from the first samples; later, far larger samples still cut the record
    batch at its target bytes (a batch of them all held the whole input in memory, made a shard
    many times --shard-size, and past 2 GiB of a column failed)."""
    big = [bytes([i]) * 40_000 for i in range(30)]
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        for i in range(70):
            sink.write({"__key__": f"t{i:03d}", "bin": b"x", "cls": i})
        for i, data in enumerate(big):
            sink.write({"__key__": f"v{i:03d}", "bin": data, "cls": 70 + i})
    shard_bytes = 200_000  # record batches of about 50,000 bytes
    manifest = convert_to(tmp_path, tmp_path / "out", "webdataset", shard_bytes=shard_bytes)
    assert manifest.rows == 100 and len(manifest.shards) >= 5
    for shard in manifest.shards:
        assert shard.bytes < 2 * shard_bytes, shard
        with pa.memory_map(str(tmp_path / "out" / shard.name)) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                assert reader.get_batch(i).nbytes < 100_000
    got = served_rows(tmp_path / "out", ["bin", "cls"], batch_size=16)
    assert got["bin"] == [b"x"] * 70 + big and got["cls"] == list(range(100))


def test_a_folder_of_train_and_val_shards_is_refused(tmp_path: Path) -> None:
    """webdataset's ImageNet example writes imagenet-train-*.tar and imagenet-val-*.tar into one
    folder: converting the folder made one dataset of both (the validation images trained on)."""
    for split in ("train", "val"):
        with wds.TarWriter(str(tmp_path / f"imagenet-{split}-000000.tar")) as sink:
            sink.write({"__key__": f"{split}0", "jpg": b"x", "cls": 1})
    with pytest.raises(ConfigError, match=r"several splits \(train: 1 file\(s\), val: 1 file\(s\)\).*/\*train\*\.tar"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(str(tmp_path / "*train*.tar"), tmp_path / "train", "webdataset")  # a pattern chooses
    assert manifest.rows == 1
    (tmp_path / "split").mkdir()
    for split in ("train", "val"):
        (tmp_path / "split" / split).mkdir()
        (tmp_path / f"imagenet-{split}-000000.tar").rename(tmp_path / "split" / split / "000000.tar")
    with pytest.raises(ConfigError, match=r"several splits .*convert .*split/train DST/train"):
        convert_to(tmp_path / "split", tmp_path / "out", "webdataset")


def test_keys_with_a_dot_type_columns_by_the_last_extension_as_webdataset_does(tmp_path: Path) -> None:
    """Keys taken from file names (``n0144_1.JPEG``) put a dot in the key: webdataset splits at the
    first dot (``jpeg.cls``) and decodes by the last part; so does convert (it stored the class as
    bytes, and the image was not the only binary column the transforms look for)."""
    with wds.TarWriter(str(tmp_path / "a.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"n0144_{i}.JPEG", "jpg": bytes([i]) * 5, "cls": i * 100, "txt": f"t{i}"})
    manifest = convert_to(tmp_path, tmp_path / "out", "webdataset")
    types = {f.name: f.type for f in manifest.schema}
    assert types == {"__key__": pa.string(), "jpeg.cls": pa.int64(), "jpeg.jpg": pa.binary(), "jpeg.txt": pa.string()}
    decoded = list(wds.WebDataset(str(tmp_path / "a.tar"), shardshuffle=False).decode())
    got = served_rows(tmp_path / "out")
    assert got["jpeg.cls"] == [s["jpeg.cls"] for s in decoded] == [0, 100, 200, 300]
    assert got["jpeg.txt"] == [s["jpeg.txt"] for s in decoded] and got["jpeg.jpg"] == [bytes([i]) * 5 for i in range(4)]


def test_the_jpg_column_takes_the_imagenet_transforms(tmp_path: Path) -> None:
    from flightfeed.client import FlightDataset, ReadOptions
    from flightfeed.server.testing import running_server

    write_shards(tmp_path, shards=2, per=4)
    convert_to(tmp_path, tmp_path / "out", "webdataset")
    with running_server({"wds": str(tmp_path / "out")}) as server:
        # the presets take the "image" column, else the request's only binary column: here "jpg"
        ds = FlightDataset(server.location, "wds", columns=["jpg", "cls"], batch_size=4, transform="imagenet_val",
                           options=ReadOptions(streams=1, report_interval=None))
        batches = list(ds)
    assert sum(len(b["cls"]) for b in batches) == 8
    image = batches[0]["jpg"]
    assert str(image.dtype) == "torch.uint8" and tuple(image.shape[1:]) in ((224, 224, 3), (3, 224, 224))


def test_cli_counts_skipped_records_and_prints_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from flightfeed.server.tools.convert import cli as convert_cli

    (tmp_path / "src").mkdir()
    write_shards(tmp_path / "src", shards=2)
    _truncate_last_member(tmp_path / "src" / "train-000001.tar")
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    args = parser.parse_args([str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress"])
    assert convert_cli.run(args) == 1  # --from auto finds the tars; the damage stops it
    assert "member s1/000009.txt at byte" in capsys.readouterr().err
    args = parser.parse_args([str(tmp_path / "src"), str(tmp_path / "o2"), "--no-progress", "--on-bad-record", "skip"])
    assert convert_cli.run(args) == 0
    captured = capsys.readouterr()
    assert "wrote 9 rows" in captured.out and "rows/s" in captured.out and "MB/s" in captured.out
    assert "skipped 2 bad record(s)" in captured.err and "s1/000009" in captured.err


def test_auto_refuses_an_ambiguous_folder(tmp_path: Path) -> None:
    from flightfeed.wire.errors import ConfigError

    write_shards(tmp_path, shards=1)
    (tmp_path / "x.tfrecord").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"holds several layouts \(tfrecord, webdataset\); name the kind with --from"):
        convert_to(tmp_path, tmp_path / "out", "auto")


def test_gzipped_shards_and_a_brace_pattern_on_s3(s3: LocalS3, tmp_path: Path) -> None:
    import gzip

    from flightfeed.server.tools.convert import ConvertSettings, convert

    (tmp_path / "src").mkdir()
    samples = write_shards(tmp_path / "src", shards=3, per=4)
    for tar in sorted((tmp_path / "src").glob("*.tar")):
        tar.with_suffix(".tar.gz").write_bytes(gzip.compress(tar.read_bytes()))
        tar.unlink()
    bucket = s3.new_bucket()
    s3.upload_dir(tmp_path / "src", f"s3://{bucket}/wds")
    settings = ConvertSettings(progress=False, kind="webdataset", storage=s3.options())
    manifest = convert(f"s3://{bucket}/wds/train-{{000001..000002}}.tar.gz", str(tmp_path / "out"), settings)
    assert manifest.rows == 8
    got = served_rows(tmp_path / "out", ["__key__", "jpg"])
    assert got["__key__"] == [s["__key__"] for s in samples[4:]] and got["jpg"] == [s["jpg"] for s in samples[4:]]


def test_long_member_names_and_odd_keys(tmp_path: Path) -> None:
    """Names over 100 bytes (pax/GNU headers written by tarfile) and dots in directories."""
    keys = [f"dir.with.dots/{'k' * 120}{i}" for i in range(3)]
    with wds.TarWriter(str(tmp_path / "long.tar")) as sink:
        for i, key in enumerate(keys):
            sink.write({"__key__": key, "seg.png": bytes([i]) * 10, "cls": i})
    manifest = convert_to(tmp_path / "long.tar", tmp_path / "out", "webdataset")
    assert [f.name for f in manifest.schema] == ["__key__", "cls", "seg.png"]
    got = served_rows(tmp_path / "out")
    assert got["__key__"] == keys and got["seg.png"] == [bytes([i]) * 10 for i in range(3)] and got["cls"] == [0, 1, 2]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_gnu_and_ustar_headers(tmp_path: Path, fmt: int) -> None:
    import io

    prefix = "p" * 90 + "/" if fmt == tarfile.USTAR_FORMAT else "q" * 150 + "/"  # ustar: the prefix field
    with tarfile.open(tmp_path / "a.tar", "w", format=fmt) as tar:
        for i in range(4):
            for ext, data in (("bin", bytes(range(i + 1))), ("txt", f"t{i}".encode())):
                info = tarfile.TarInfo(f"{prefix}{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    convert_to(tmp_path / "a.tar", tmp_path / "out", "webdataset")
    got = served_rows(tmp_path / "out")
    assert got["__key__"] == [f"{prefix}{i:04d}" for i in range(4)]
    assert got["bin"] == [bytes(range(i + 1)) for i in range(4)] and got["txt"] == [f"t{i}" for i in range(4)]
