"""The Arrow shard reader's two I/O modes and the lease watcher's lifetime."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from flightfeed.server.readers.arrow.ipc_file import ArrowShard
from flightfeed.server.readers.arrow.lease_watch import LeaseWatcher
from flightfeed.server.readers.arrow.mapped import MappedFile
from flightfeed.wire.errors import ConfigError, ShardError
from tests.support.datasets import write_dataset


def _shard(tmp_path: Path, stream_format: bool = False) -> Path:
    write_dataset(tmp_path, [[50, 30, 20]], stream_format=stream_format)
    return next(tmp_path.glob("part-00000.*"))


@pytest.mark.parametrize("stream_format", [False, True])
def test_read_mode_serves_the_same_batches_as_the_memory_map(tmp_path: Path, stream_format: bool) -> None:
    path = str(_shard(tmp_path, stream_format))
    mapped, read = ArrowShard(path), ArrowShard(path, io="read")
    try:
        assert mapped.zero_copy and mapped.io == "mmap"
        assert read.io == "read" and read.zero_copy == stream_format
        assert list(read.chunk_offsets) == list(mapped.chunk_offsets) == [0, 50, 80, 100]
        for c in range(3):
            assert read.read_chunk(c).equals(mapped.read_chunk(c))
    finally:
        mapped.close()
        read.close()


def test_read_mode_notices_an_in_place_change(tmp_path: Path) -> None:
    path = _shard(tmp_path)
    shard = ArrowShard(str(path), io="read")
    seen: list[str] = []
    shard.watch(seen.append)
    shard.read_chunk(0)
    with open(path, "r+b") as f:  # same size, new bytes, new mtime
        f.seek(100)
        f.write(b"x")
        os.utime(f.fileno(), ns=(1, 1))
    with pytest.raises(ShardError, match=re.escape(str(path))):
        shard.read_chunk(1)
    assert len(seen) == 1 and "overwritten in place" in seen[0]
    shard.close()


def test_a_lease_watcher_runs_only_while_files_are_registered(tmp_path: Path) -> None:
    path = str(_shard(tmp_path))
    watch = LeaseWatcher()
    files = [MappedFile(path), MappedFile(path)]
    broken: list[MappedFile] = []
    for f in files:
        watch.register(f, broken.append)
    thread = watch._thread
    assert thread is not None and thread.is_alive()
    for f in files:
        watch.unregister(f)
        f.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and not watch.running
    assert broken == []


def test_a_lease_break_detaches_the_mapping_before_the_writer_goes_on(tmp_path: Path) -> None:
    path = _shard(tmp_path)
    shard = ArrowShard(str(path))
    before = shard.read_chunk(2).to_pydict()
    seen: list[str] = []
    shard.watch(seen.append)
    os.truncate(path, 10)  # blocks until the watcher has swapped the mapping for a copy
    assert seen and str(path) in seen[0]
    assert shard.read_chunk(2).to_pydict() == before  # old bytes, no SIGBUS
    shard.close()


def test_unknown_io_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'fast'"):
        ArrowShard(str(_shard(tmp_path)), io="fast")


def test_a_server_reading_with_positioned_reads_serves_the_same_epoch(tmp_path: Path) -> None:
    from flightfeed.client import FlightDataset, ReadOptions
    from flightfeed.server.storage import StorageOptions
    from flightfeed.server.testing import running_server

    write_dataset(tmp_path, [[50, 30, 20], [40, 60]])
    epochs = []
    for io in ("mmap", "read"):
        with running_server({"d": str(tmp_path)}, storage=StorageOptions(arrow_io=io, small_shard_bytes=0)) as srv:
            assert all(getattr(s, "io", None) == io for s in srv.catalog.get("d").shards)
            ds = FlightDataset(
                srv.location,
                "d",
                batch_size=16,
                seed=2,
                options=ReadOptions(streams=2, report_interval=None),
            )
            epochs.append([(int(i), b["image"][k].sum().item()) for b in ds for k, i in enumerate(b["index"])])
    assert epochs[0] == epochs[1] and len(epochs[0]) == 200
