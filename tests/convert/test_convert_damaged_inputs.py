"""Damaged inputs stop ``flightfeed convert`` with an error naming the file and what to do (or,
under ``--on-bad-record skip``, are counted): a truncated Parquet file, a truncated LMDB
``data.mdb`` (read past its end it killed the process with SIGBUS), a cut-short ``.tar.gz``
WebDataset shard (a bare EOFError traceback before); and a folder of several splits' Parquet
files is refused rather than converted as one dataset."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.wire.errors import DatasetError
from tests.convert.format_roundtrip import convert_to


def cut(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_parquet_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    for name in ("a", "b"):
        pq.write_table(pa.table({"x": list(range(500))}), tmp_path / "src" / f"{name}.parquet")
    cut(tmp_path / "src" / "b.parquet", 0.5)
    with pytest.raises(DatasetError, match=r"src/b\.parquet: not a readable Parquet file \(damaged or truncated\?\)"):
        convert_to(tmp_path / "src", tmp_path / "out", "parquet")


def test_a_truncated_lmdb_file_is_named_not_a_crash(tmp_path: Path) -> None:
    lmdb = pytest.importorskip("lmdb", reason="lmdb is not installed (pip install lmdb)")
    msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")
    env = lmdb.open(str(tmp_path / "train.lmdb"), map_size=64 << 20)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(str(i).encode(), msgpack.packb((bytes([i % 256]) * 5000, i), use_bin_type=True))
        txn.put(b"__len__", msgpack.packb(300))
    env.close()
    cut(tmp_path / "train.lmdb" / "data.mdb", 0.5)
    # a subprocess: the old code died of SIGBUS, which would take pytest with it
    done = subprocess.run(
        [sys.executable, "-m", "flightfeed.server", "convert", str(tmp_path / "train.lmdb"), str(tmp_path / "out"),
         "--from", "lmdb", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "train.lmdb: data.mdb holds" in done.stderr and "the file is truncated" in done.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_cut_short_tar_gz_shard_is_named_and_counted(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset", reason="webdataset is not installed (pip install webdataset)")
    for s in range(2):
        with wds.TarWriter(str(tmp_path / f"train-{s}.tar")) as sink:
            for i in range(20):
                sink.write({"__key__": f"k{s}-{i:02d}", "bin": bytes([i]) * 3000, "cls": i})
        (tmp_path / f"train-{s}.tar.gz").write_bytes(gzip.compress((tmp_path / f"train-{s}.tar").read_bytes()))
        (tmp_path / f"train-{s}.tar").unlink()
    cut(tmp_path / "train-1.tar.gz", 0.6)
    with pytest.raises(DatasetError, match=r"train-1\.tar\.gz at byte \d+: the gzip stream is damaged or truncated"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(tmp_path, tmp_path / "out2", "webdataset", on_bad_record="skip")
    bad = manifest.extra["bad_records"]
    assert isinstance(bad, dict) and bad["skipped"] == 2  # the damage and the sample it cut short
    assert 20 < manifest.rows < 40


def test_a_folder_of_parquet_splits_is_refused(tmp_path: Path) -> None:
    """The Hugging Face Hub's Parquet layout (data/train-00000-of-00002.parquet beside
    data/test-00000-of-00001.parquet) converted as one dataset of every split."""
    from flightfeed.wire.errors import ConfigError

    (tmp_path / "data").mkdir()
    for name in ("train-00000-of-00002", "train-00001-of-00002", "test-00000-of-00001"):
        pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "data" / f"{name}.parquet")
    says = r"several splits \(test: 1 file\(s\), train: 2 file\(s\)\).*\*train\*\.parquet"
    with pytest.raises(ConfigError, match=says):
        convert_to(tmp_path / "data", tmp_path / "out", "parquet")
    assert convert_to(str(tmp_path / "data" / "*train*.parquet"), tmp_path / "train", "parquet").rows == 4


def test_a_cut_short_tfrecord_gz_is_named_and_skip_reports_records_not_images(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .tfrecord.gz cut short raised a bare EOFError; skipped, it was also reported as "image(s)
    that do not decode" (and written to manifest.json's skipped_images) for any record source."""
    pytest.importorskip("tfrecord", reason="tfrecord is not installed (pip install tfrecord)")
    from tfrecord import TFRecordWriter

    from flightfeed.server.cli import main

    writer = TFRecordWriter(str(tmp_path / "a.tfrecord"))
    for i in range(200):
        writer.write({"label": (i, "int"), "raw": (bytes([i % 256]) * 50, "byte")})
    writer.close()
    data = gzip.compress((tmp_path / "a.tfrecord").read_bytes())
    (tmp_path / "a.tfrecord").unlink()
    (tmp_path / "a.tfrecord.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=r"a\.tfrecord\.gz at byte \d+: the GZIP stream is damaged or truncated"):
        convert_to(tmp_path, tmp_path / "out", "tfrecord")
    argv = ["convert", str(tmp_path), str(tmp_path / "out2"), "--from", "tfrecord", "--on-bad-record", "skip",
            "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "skipped 1 bad record(s)" in err and "image" not in err
    assert "skipped_images" not in (tmp_path / "out2" / "manifest.json").read_text()
