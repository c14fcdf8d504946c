"""Shards are hashed while they are written (tools/convert/shard_hasher.py): the manifest's
sha256 and block checksums are exactly those of the finished files, on the background thread or
inline, and a shard that does not read back whole is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.server.readers.blocks import digest_file
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.convert.shard_hasher import HashingFile, ShardHasher
from flightfeed.server.tools.convert.writer import ShardWriter
from flightfeed.wire.errors import ShardError

SCHEMA = pa.schema([("x", pa.binary()), ("i", pa.int64())])  # type: ignore[arg-type]


def _batch(k: int, rows: int = 30) -> pa.RecordBatch:
    rng = [os.urandom(10_000 + 7 * k + j) for j in range(rows)]
    return pa.record_batch([pa.array(rng, pa.binary()), pa.array(range(rows), pa.int64())], schema=SCHEMA)


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("block_bytes", [4096, 65536, 1 << 20])
def test_digests_are_those_of_the_finished_files(tmp_path: Path, background: bool, block_bytes: int) -> None:
    writer = ShardWriter(
        str(tmp_path), SCHEMA, shard_bytes=1_500_000, block_bytes=block_bytes, background_hash=background
    )
    for k in range(12):
        writer.write(_batch(k))
    shards = writer.close()
    assert len(shards) >= 2
    for shard in shards:
        path = str(tmp_path / shard.name)
        sha256, blocks = digest_file(path, block_bytes)
        assert (shard.sha256, shard.blocks) == (sha256, blocks)
        assert shard.bytes == os.path.getsize(path) and blocks.covers(shard.bytes)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("background", [True, False])
def test_whole_blocks_uneven_writes_and_the_queue_limit(
    tmp_path: Path, background: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from flightfeed.server.tools.convert import shard_hasher

    monkeypatch.setattr(shard_hasher, "MAX_QUEUED_BYTES", 5000)  # the writer waits for the hasher
    path = tmp_path / "f"
    data = os.urandom(5 * 4096)
    with ThreadPoolExecutor(1) as pool:
        hasher = ShardHasher(str(path), 4096, pool if background else None)
        out = HashingFile(str(path), hasher)
        for lo, hi in ((0, 1), (1, 4097), (4097, 9000), (9000, 15000), (15000, len(data))):
            assert out.write(memoryview(data)[lo:hi]) == hi - lo
        out.close()
        got = hasher.finish(len(data))
    assert got == digest_file(str(path), 4096)
    assert len(got[1].hashes) == 5


@pytest.mark.parametrize("background", [True, False])
def test_a_shard_that_does_not_hold_what_was_written_is_refused(tmp_path: Path, background: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "f"
    with ThreadPoolExecutor(1) as pool:
        hasher = ShardHasher(str(path), 4096, pool if background else None)
        out = HashingFile(str(path), hasher)
        out.write(os.urandom(10_000))
        out.close()
        os.truncate(path, 5_000)  # the disk lost what was written
        with pytest.raises(ShardError, match="holds 5000 bytes but 10000 were written"):
            hasher.finish(os.path.getsize(path))


def test_a_hashing_failure_is_raised_to_the_writer(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    class Broken:
        def update(self, data: object) -> None:
            raise MemoryError("no memory for the hash")

    with ThreadPoolExecutor(1) as pool:
        hasher = ShardHasher(str(tmp_path / "f"), 4096, pool)
        hasher._sha = Broken()  # type: ignore[assignment]
        hasher.update(b"x" * 100)  # fails on the hashing thread
        with pytest.raises(ShardError, match=r"hashing written shard .*f failed: no memory for the hash"):
            hasher.finish(100)


@pytest.mark.parametrize("background", [True, False])
def test_convert_manifest_matches_the_files(tmp_path: Path, background: bool) -> None:
    src = tmp_path / "src"
    src.mkdir()
    table = pa.table({"x": [os.urandom(5_000) for _ in range(600)], "i": list(range(600))})
    pq.write_table(table, src / "a.parquet")
    dst = tmp_path / "dst"
    settings = ConvertSettings(
        progress=False, shard_bytes=1_000_000, block_bytes=65536, rows_per_batch=50, background_hash=background
    )
    manifest = convert(str(src), str(dst), settings)
    assert len(manifest.shards) >= 3
    again = Manifest.from_json((dst / MANIFEST_NAME).read_text(), "manifest")
    for shard in again.shards:
        assert (shard.sha256, shard.blocks) == digest_file(str(dst / shard.name), 65536)


def test_cli_hash_thread_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from flightfeed.server.tools.convert import cli as convert_cli
    from flightfeed.server.tools.convert import pipeline

    used: list[bool] = []
    real = ShardWriter

    def spy(*args: object, **kw: bool) -> object:
        used.append(kw["background_hash"])
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "ShardWriter", spy)
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"x": [os.urandom(3000) for _ in range(200)]}), src / "a.parquet")
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    for flags, out in (([], "one"), (["--hash-thread"], "two")):
        args = parser.parse_args([str(src), str(tmp_path / out), "--no-progress", "--shard-size", "200KB", *flags])
        assert convert_cli.run(args) == 0
        manifest = Manifest.from_json((tmp_path / out / MANIFEST_NAME).read_text(), "manifest")
        for shard in manifest.shards:
            assert shard.blocks is not None
            assert (shard.sha256, shard.blocks) == digest_file(str(tmp_path / out / shard.name), shard.blocks.size)
    assert used == [False, True]


def test_many_small_buffers_through_the_thread_lose_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stress of the hand-over between hashing jobs (a job that finds its queue empty and a buffer
    fed just then): the digest is hashlib's over the whole stream."""
    import hashlib
    import random
    from concurrent.futures import ThreadPoolExecutor

    from flightfeed.server.tools.convert import shard_hasher

    monkeypatch.setattr(shard_hasher, "MAX_QUEUED_BYTES", 20_000)
    rng = random.Random(7)
    chunks = [rng.randbytes(rng.randint(1, 12_000)) for _ in range(3000)]
    whole = b"".join(chunks)
    with ThreadPoolExecutor(1) as pool:
        hasher = ShardHasher(str(tmp_path / "f"), 4096, pool)
        for chunk in chunks:
            hasher.update(chunk)
        sha256, blocks = hasher.finish(len(whole))
    assert sha256 == hashlib.sha256(whole).hexdigest()
    assert len(blocks.hashes) == -(-len(whole) // 4096)
