"""Where ``flightfeed convert`` writes (a local folder or an S3 prefix): a conversion stopped
part-way (Ctrl-C, an error) leaves nothing that ``flightfeed serve DST`` would serve as if it were
the whole dataset, an ``--overwrite`` stopped part-way keeps the old dataset, and a DST already
holding other shard files (which ``serve DST`` would serve with the new rows) is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from flightfeed.server.storage.resolve import open_dataset
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import writer as writer_module
from flightfeed.wire.errors import ConfigError, DatasetError
from tests.convert.format_roundtrip import convert_to


def parquet_source(path: Path, rows: int = 2000) -> Path:
    path.mkdir()
    pq.write_table(pa.table({"x": list(range(rows)), "b": [bytes(40)] * rows}), path / "a.parquet")
    return path


def interrupt_on_write(monkeypatch: pytest.MonkeyPatch, at: int) -> None:
    """Ctrl-C arrives while the ``at``-th record batch is written (earlier shards are complete)."""
    real = writer_module.ShardWriter.write
    calls = {"n": 0}

    def write(self: Any, batch: pa.RecordBatch) -> None:
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        real(self, batch)

    monkeypatch.setattr(writer_module.ShardWriter, "write", write)


def test_an_interrupted_convert_leaves_nothing_that_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = parquet_source(tmp_path / "src")
    interrupt_on_write(monkeypatch, at=6)
    with pytest.raises(KeyboardInterrupt):
        convert_to(src, tmp_path / "out", "parquet", shard_bytes=8 << 10, rows_per_batch=100)
    assert list((tmp_path / "out").iterdir()) == []  # no shard, no manifest, no staging folder left
    with pytest.raises(DatasetError, match="no shard files found"):
        open_dataset("d", str(tmp_path / "out"))


def test_an_interrupted_overwrite_keeps_the_old_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = parquet_source(tmp_path / "src")
    old = convert_to(src, tmp_path / "out", "parquet", shard_bytes=8 << 10, rows_per_batch=100)
    assert len(old.shards) > 2
    interrupt_on_write(monkeypatch, at=6)
    with pytest.raises(KeyboardInterrupt):
        convert_to(src, tmp_path / "out", "parquet", shard_bytes=4 << 10, rows_per_batch=50, overwrite=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted([s.name for s in old.shards] + ["manifest.json"])
    ds = open_dataset("d", str(tmp_path / "out"))
    try:
        assert ds.num_rows == 2000
    finally:
        ds.close()
    monkeypatch.undo()
    new = convert_to(src, tmp_path / "out", "parquet", shard_bytes=4 << 10, rows_per_batch=50, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        [s.name for s in new.shards] + ["manifest.json"]
    )


def test_a_dst_holding_other_shard_files_is_refused(tmp_path: Path) -> None:
    src = parquet_source(tmp_path / "src", rows=100)
    convert_to(src, tmp_path / "out" / "old", "parquet")
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=r"holds 1 other shard file\(s\) \(e\.g\. .*old/part-00000\.arrow\)"):
            convert_to(src, tmp_path / "out", "parquet", overwrite=overwrite)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a shard")
    assert convert_to(src, tmp_path / "notes", "parquet").rows == 100  # other files are fine


def test_on_s3_an_interrupted_convert_leaves_nothing_that_serves(
    s3: LocalS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = parquet_source(tmp_path / "src")
    uri = f"s3://{s3.new_bucket()}/ds"
    interrupt_on_write(monkeypatch, at=6)  # two shards already uploaded
    with pytest.raises(KeyboardInterrupt):
        convert_to(src, uri, "parquet", shard_bytes=8 << 10, rows_per_batch=100, storage=s3.options())
    listing = s3.fs().get_file_info(pafs.FileSelector(uri[5:], recursive=True, allow_not_found=True))
    assert [i.path for i in listing] == []  # nothing served, nothing staged left behind
    monkeypatch.undo()
    old = convert_to(src, uri, "parquet", shard_bytes=8 << 10, rows_per_batch=100, storage=s3.options())
    interrupt_on_write(monkeypatch, at=6)
    with pytest.raises(KeyboardInterrupt):
        convert_to(src, uri, "parquet", shard_bytes=4 << 10, rows_per_batch=50, storage=s3.options(), overwrite=True)
    listing = s3.fs().get_file_info(pafs.FileSelector(uri[5:], recursive=True))
    assert sorted(i.base_name for i in listing) == sorted([s.name for s in old.shards] + ["manifest.json"])
    ds = open_dataset("d", uri, s3.options(tmp_path / "cache"))
    try:
        assert ds.num_rows == 2000
    finally:
        ds.close()
    s3.fs().create_dir(f"{uri[5:]}/old")
    with s3.fs().open_output_stream(f"{uri[5:]}/old/x.parquet") as out:
        out.write(b"PAR1")
    with pytest.raises(ConfigError, match=r"holds 1 other shard object\(s\) \(e\.g\. s3://.*/ds/old/x\.parquet\)"):
        convert_to(src, uri, "parquet", storage=s3.options(), overwrite=True)


def test_the_cli_says_what_an_interrupt_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flightfeed.server.cli import main

    src = parquet_source(tmp_path / "src")
    interrupt_on_write(monkeypatch, at=3)
    argv = ["convert", str(src), str(tmp_path / "out"), "--shard-size", "8KB", "--rows-per-batch", "100",
            "--no-progress"]
    assert main(argv) == 130
    assert "interrupted; the dataset being written was removed" in capsys.readouterr().err
    assert list((tmp_path / "out").iterdir()) == []


def test_a_killed_conversions_staging_folder_is_named_then_removed_by_overwrite(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = parquet_source(tmp_path / "src", rows=100)
    stale = tmp_path / "out" / ".flightfeed-convert-dead"  # what a SIGKILLed conversion leaves
    stale.mkdir(parents=True)
    (stale / "part-00000.arrow").write_bytes(b"partial")
    with caplog.at_level("WARNING"):
        convert_to(src, tmp_path / "out", "parquet")
    assert "holds 1 staging folder(s) of conversions that were killed" in caplog.text and stale.exists()
    convert_to(src, tmp_path / "out", "parquet", overwrite=True)
    assert not stale.exists()
    ds = open_dataset("d", str(tmp_path / "out"))
    try:
        assert ds.num_rows == 100
    finally:
        ds.close()
