"""A WebDataset shard cut short exactly at a member boundary (no end-of-archive blocks) is a
truncated file: refused under ``--on-bad-record error``, a counted bad record under ``skip``
(it converted silently to the rows before the cut)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from flightfeed.wire.errors import DatasetError
from tests.convert.format_roundtrip import convert_to, served_rows

wds = pytest.importorskip("webdataset", reason="webdataset is not installed (pip install webdataset)")


def write_shard(path: Path, samples: int = 20) -> None:
    with wds.TarWriter(str(path)) as sink:
        for i in range(samples):
            sink.write({"__key__": f"k{i:03d}", "cls": i, "txt": f"caption {i}"})


def cut_before_member(path: Path, member: int) -> int:
    """Keep ``path`` only up to the header of its ``member``-th member; return that offset."""
    with tarfile.open(path) as tar:
        offset = tar.getmembers()[member].offset
    path.write_bytes(path.read_bytes()[:offset])
    return offset


def test_a_shard_cut_at_a_member_boundary_is_refused_by_the_cli(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    write_shard(tmp_path / "src" / "train-000000.tar")
    offset = cut_before_member(tmp_path / "src" / "train-000000.tar", 30)  # 15 whole samples of 2 members
    done = subprocess.run(
        [sys.executable, "-m", "flightfeed.server", "convert", str(tmp_path / "src"), str(tmp_path / "out"),
         "--from", "webdataset", "--on-bad-record", "error", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode != 0, done.stdout  # was: exit 0 and a dataset of 15 of 20 rows
    expected = f"train-000000.tar at byte {offset}: truncated: the file ends without the tar's end-of-archive"
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skip_counts_the_cut_shard_and_the_sample_it_may_have_cut(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.tar")
    write_shard(tmp_path / "b.tar", samples=3)
    cut_before_member(tmp_path / "a.tar", 30)
    with pytest.raises(DatasetError, match=r"a\.tar at byte \d+: truncated: the file ends without"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(tmp_path, tmp_path / "out2", "webdataset", on_bad_record="skip")
    bad = manifest.extra["bad_records"]
    assert isinstance(bad, dict) and bad["skipped"] == 2, bad  # the cut, and sample k014 (its members may go on)
    assert any("a.tar: sample k014" in where for where in bad["named"]), bad
    keys = served_rows(tmp_path / "out2", ["__key__"])["__key__"]
    assert keys == [f"k{i:03d}" for i in range(14)] + [f"k{i:03d}" for i in range(3)]


def test_an_empty_tar_is_named_and_a_whole_one_still_converts(tmp_path: Path) -> None:
    write_shard(tmp_path / "a.tar", samples=4)
    manifest = convert_to(tmp_path, tmp_path / "out", "webdataset")  # the end-of-archive blocks are there
    assert manifest.rows == 4 and manifest.extra["bad_records"]["skipped"] == 0
    (tmp_path / "b.tar").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"b\.tar at byte 0: empty file, not a tar archive"):
        convert_to(tmp_path, tmp_path / "out2", "webdataset")


def test_a_tar_gz_whose_tar_was_cut_before_compressing_is_refused(tmp_path: Path) -> None:
    """The gzip stream is whole, the tar inside it is not: the same refusal."""
    import gzip

    write_shard(tmp_path / "a.tar", samples=6)
    offset = cut_before_member(tmp_path / "a.tar", 8)
    (tmp_path / "a.tar.gz").write_bytes(gzip.compress((tmp_path / "a.tar").read_bytes()))
    (tmp_path / "a.tar").unlink()
    with pytest.raises(DatasetError, match=rf"a\.tar\.gz at byte {offset}: truncated: the file ends without"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")


def test_a_shard_cut_inside_a_members_padding_is_refused(tmp_path: Path) -> None:
    """The member's data is whole but the file ends inside the zero padding after it."""
    write_shard(tmp_path / "a.tar")
    with tarfile.open(tmp_path / "a.tar") as tar:
        member = tar.getmembers()[9]  # k004.txt: the second member of sample k004
    cut = member.offset_data + member.size + 5
    (tmp_path / "a.tar").write_bytes((tmp_path / "a.tar").read_bytes()[:cut])
    with pytest.raises(DatasetError, match=rf"a\.tar at byte {cut}: truncated: the file ends inside the padding "
                                           r"after member k004\.txt"):
        convert_to(tmp_path, tmp_path / "out", "webdataset")
    manifest = convert_to(tmp_path, tmp_path / "out2", "webdataset", on_bad_record="skip")
    assert manifest.rows == 4 and manifest.extra["bad_records"]["skipped"] == 2  # the cut, and k004 (in doubt)
