"""The bound on open shard files and what the catalog reads at start-up (docs/large-datasets.md), unit level:
the LRU (``readers/open_files``), a memory map that outlives its closed reader while batches use
it, the Arrow footer reader (``readers/ipc_footer``), and a start-up from ``manifest.json``."""

from __future__ import annotations

import gc
import hashlib
import os
import resource
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.readers.arrow.footer import read_ipc_layout
from flightfeed.server.readers.arrow.ipc_file import ArrowShard
from flightfeed.server.readers.open_files import MIN_OPEN, OpenFiles, default_max_open, raise_nofile_limit
from flightfeed.server.storage import StorageOptions
from flightfeed.server.storage import local_shards as local_shards_module
from flightfeed.server.storage.manifest import Manifest, ManifestShard
from flightfeed.server.storage.resolve import open_dataset
from tests.support.datasets import write_dataset


class _File:
    """Stands in for an open reader: counts how many are open at once."""

    open_now = 0
    peak = 0

    def __init__(self, key: int) -> None:
        self.key = key
        self.closed = False
        _File.open_now += 1
        _File.peak = max(_File.peak, _File.open_now)

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True
        _File.open_now -= 1


@pytest.fixture(autouse=True)
def _reset_counts() -> None:
    _File.open_now = _File.peak = 0


def test_the_bound_closes_the_least_recently_used_idle_file() -> None:
    files = OpenFiles(MIN_OPEN)
    for k in range(50):
        with files.use(k, lambda k=k: _File(k)):  # type: ignore[misc]
            pass
        with files.use(0, lambda: _File(0)):  # shard 0 is used all the time: it stays open
            pass
    assert _File.peak <= MIN_OPEN and _File.open_now == MIN_OPEN
    assert files.is_open(0) and files.is_open(49) and not files.is_open(1)
    snap = files.snapshot()
    assert snap["open"] == MIN_OPEN and snap["peak"] <= MIN_OPEN and snap["opened"] == 50


def test_a_file_in_use_is_never_closed_under_its_user() -> None:
    files = OpenFiles(MIN_OPEN)
    with files.use("held", lambda: _File(-1)) as held:
        for k in range(100):
            with files.use(k, lambda k=k: _File(k)):  # type: ignore[misc]
                pass
        assert not held.closed
        files.drop("held")  # dropped while in use: closed when the user lets go
        assert not held.closed
        with files.use("held", lambda: _File(-2)) as fresh:  # a new user gets a new file at once
            assert fresh is not held
    assert held.closed and not fresh.closed


def test_files_kept_alive_by_data_in_flight_count_against_the_bound() -> None:
    files = OpenFiles(MIN_OPEN)
    for k in range(MIN_OPEN):
        with files.use(k, lambda k=k: _File(k)):  # type: ignore[misc]
            pass
    releases = [files.retire() for _ in range(4)]  # four closed maps still used by batches
    with files.use("new", lambda: _File(99)):
        pass
    assert files.snapshot()["open"] == MIN_OPEN - 4  # room was made for them
    for release in releases:
        release()
        release()  # a second call does nothing
    assert files.snapshot()["retired"] == 0


def test_a_file_being_closed_still_counts_until_it_is_closed() -> None:
    """An evicted file is closed outside the lock; a thread opening meanwhile must not use the
    room that file still holds (the bound counts descriptors, not entries)."""
    files = OpenFiles(MIN_OPEN + 1)
    closing, go_on = threading.Event(), threading.Event()

    class _SlowClose(_File):
        def close(self) -> None:
            closing.set()
            go_on.wait(10)
            super().close()

    with files.use("slow", lambda: _SlowClose(-1)):  # the least recently used file
        pass
    for k in range(MIN_OPEN):
        with files.use(k, lambda k=k: _File(k)):  # type: ignore[misc]
            pass
    shrink = threading.Thread(target=files.set_limit, args=(MIN_OPEN,))
    shrink.start()  # evicts "slow", whose close now hangs
    try:
        assert closing.wait(10)
        with files.use("new", lambda: _File(100)):  # must close an idle file: "slow" is still open
            assert _File.open_now <= MIN_OPEN
    finally:
        go_on.set()
        shrink.join(10)
    assert _File.open_now <= MIN_OPEN and files.snapshot()["open"] <= MIN_OPEN


def test_a_map_counts_as_released_only_after_its_descriptor_is_closed(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[50]])
    path = tmp_path / "part-00000.arrow"
    shard = ArrowShard(str(path))
    batch = shard.read_chunk(0)
    seen: list[bool] = []
    shard.close(released=lambda: seen.append(_fd_open(path)))
    del batch
    gc.collect()
    assert seen == [False]  # released() ran, and the descriptor was already gone


def test_a_closed_map_keeps_its_descriptor_and_lease_while_a_batch_uses_it(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[50, 30, 20]])
    path = tmp_path / "part-00000.arrow"
    shard = ArrowShard(str(path))
    batch = shard.read_chunk(2)
    before = batch.to_pydict()
    released: list[bool] = []
    shard.close(released=lambda: released.append(True))
    assert not released and _fd_open(path)  # the batch still reads the map: file and lease stay
    os.truncate(path, 10)  # the lease breaks: the map is swapped for a copy before the writer goes on
    assert batch.to_pydict() == before  # no SIGBUS, the old bytes
    del batch
    gc.collect()
    assert released == [True] and not _fd_open(path)


def _fd_open(path: Path) -> bool:
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def _write(path: Path, batches: list[int], *, legacy: bool = False) -> None:
    schema = pa.schema([pa.field("a", pa.int64()), pa.field("s", pa.string())])  # type: ignore[arg-type]
    options = ipc.IpcWriteOptions(use_legacy_format=legacy)
    with ipc.new_file(str(path), schema, options=options) as writer:
        for n in batches:
            arr = np.arange(n, dtype=np.int64)
            writer.write_batch(pa.record_batch([pa.array(arr), pa.array([str(i) for i in arr])], schema=schema))


@pytest.mark.parametrize(
    ("batches", "legacy"),
    [([10], False), ([100, 0, 30000, 7] * 30, False), ([3, 4], True), ([], False)],
    ids=["one", "many-with-empty-and-large", "legacy", "none"],
)
def test_the_footer_reader_agrees_with_pyarrow(tmp_path: Path, batches: list[int], legacy: bool) -> None:
    path = tmp_path / "x.arrow"
    _write(path, batches, legacy=legacy)
    fd = os.open(path, os.O_RDONLY)
    try:
        layout = read_ipc_layout(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    reader = ipc.open_file(str(path))
    assert list(layout.batch_rows) == [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
    assert ipc.read_schema(pa.py_buffer(layout.schema_message)).equals(reader.schema)


def test_the_footer_reader_refuses_what_is_not_a_whole_ipc_file(tmp_path: Path) -> None:
    write_dataset(tmp_path / "stream", [[5]], stream_format=True)
    path = tmp_path / "x.arrow"
    _write(path, [10, 20])
    data = path.read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) - 40])
    for bad in [next((tmp_path / "stream").glob("*.arrows")), tmp_path / "cut.arrow"]:
        fd = os.open(bad, os.O_RDONLY)
        try:
            with pytest.raises(ValueError, match=r"magic|outside|short"):
                read_ipc_layout(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)


def test_a_manifest_describes_the_shards_without_reading_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dataset(tmp_path, [[7, 3], [10], [4, 4, 4]])
    plain = open_dataset("d", str(tmp_path), StorageOptions(verify="off"))
    shards = []
    for path in sorted(tmp_path.glob("*.arrow")):
        data = path.read_bytes()
        reader = ipc.open_file(str(path))
        rows = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
        shards.append(ManifestShard(path.name, sum(rows), len(data), hashlib.sha256(data).hexdigest(), tuple(rows)))
    (tmp_path / "manifest.json").write_text(Manifest(plain.schema, shards).to_json())

    def no_footers(*_: object) -> object:
        raise AssertionError("a footer was read although the manifest describes every shard")

    monkeypatch.setattr(local_shards_module, "read_ipc_layout", no_footers)
    described = open_dataset("d", str(tmp_path), StorageOptions(verify="off"))
    assert described.fingerprint == plain.fingerprint and described.num_rows == plain.num_rows == 32
    assert np.array_equal(described.chunk_starts, plain.chunk_starts)
    assert described.chunk(5).equals(plain.chunk(5))  # read on demand, checked against the manifest
    plain.close()
    described.close()


def test_the_default_bound_leaves_room_for_sockets_and_respects_the_map_limit() -> None:
    assert default_max_open(1024, 65530) == 768
    assert default_max_open(256, 65530) == MIN_OPEN  # nothing left after the headroom: the smallest bound
    assert default_max_open(1 << 20, 65530) == 65530 // 4
    before, after = raise_nofile_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert after == soft >= before and (hard == resource.RLIM_INFINITY or soft == hard)
