"""One shard cache budget for every process sharing the directory (docs/large-datasets.md): downloads in flight
and evicted-but-mapped files of all processes count against ``--cache-size``, a dead process's
claim is reclaimed, and another process's eviction is a miss (fetched again), never an error."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.storage.cache import room as cache_room
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.cache.files import CacheFiles, sha256_file
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.testing.local_s3 import LocalS3
from tests.cluster.conftest import action, eventually
from tests.storage.test_cache_disk import _files, _held_by, s3_dataset
from tests.support.disk_probe import private_tmpfs, private_tmpfs_works, used_bytes
from tests.support.listing import cache_disk_bytes
from tests.support.processes import start_serve

SHARD = 100
_BOOKKEEPING = 256 << 10  # a tmpfs page per metadata, claim and journal file
ROWS = 1500  # of 16 KiB: 8 shards of ~3 MB


def _committed_and_staged(directory: Path) -> int:
    """Bytes of the cache's data files and of the downloads staged in ``.tmp``."""
    return cache_disk_bytes(directory)


def test_processes_sharing_a_directory_keep_one_budget(tmp_path: Path) -> None:
    """Three caches (as three processes would: nothing shared in memory) each start a download
    into a full cache at once: the committed files plus all downloads stay within the limit.
    (Each process used to reserve room for its own download only: 1,200 bytes in 1,000.)"""
    caches = [ShardCache(str(tmp_path), max_bytes=10 * SHARD, wait_for_room_s=10.0) for _ in range(3)]
    for i in range(10):
        caches[0].acquire(f"old-{i}", _fill(b"o"), size=SHARD).release()
    together = threading.Barrier(3, timeout=30)
    peak = [0]
    errors: list[BaseException] = []

    def fetch(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(b"n" * SHARD)
        together.wait()  # all three downloads are in flight now
        peak[0] = max(peak[0], _committed_and_staged(tmp_path))
        together.wait()

    def download(i: int) -> None:
        try:
            caches[i].acquire(f"new-{i}", fetch, size=SHARD).release()
        except BaseException as exc:  # (a thread's exception would not fail the test)
            errors.append(exc)

    threads = [threading.Thread(target=download, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert peak[0] <= 10 * SHARD, peak
    for cache in caches:
        assert cache.total_bytes() == 10 * SHARD


def test_a_file_another_process_maps_is_asked_for_not_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlinking a file another process maps does not give its space back (the map holds it)
    and that process may download the shard again meanwhile. The process that needs the room asks
    for it instead: the other closes its idle reader, and only then is the file evicted. (It was
    unlinked at once, its bytes held on disk until the other process noticed.)"""
    monkeypatch.setattr(cache_room, "STUCK_AFTER_S", 60.0)  # no overdraft: the room must be given back
    one = ShardCache(str(tmp_path), max_bytes=3 * SHARD, wait_for_room_s=60.0)
    two = ShardCache(str(tmp_path), max_bytes=3 * SHARD, wait_for_room_s=60.0)
    released: list[bool] = []
    mapping: list[Callable[[], None]] = []

    def close_reader() -> None:  # two's reader of a, idle: closing it drops the map
        released.append(os.path.exists(path))  # asked while the file is still there
        mapping.pop()()

    lease = two.acquire("a", _fill(b"a"), size=SHARD, on_release=close_reader)
    path = lease.path
    mapping.append(two.track_mapping(lease))  # two maps a (an open reader)
    lease.release()
    pinned = [one.acquire(key, _fill(b"x"), size=SHARD) for key in ("b", "c")]  # one reads b and c
    with one.acquire("d", _fill(b"d"), size=SHARD):  # needs a's room
        assert released == [True]
        assert not os.path.exists(path)
        assert _committed_and_staged(tmp_path) <= 3 * SHARD
    assert one.room.asked == 1 and two.room.released == 1 and one.over_limit == 0
    for held in pinned:
        held.release()


def test_processes_waiting_on_each_other_do_not_deadlock(tmp_path: Path) -> None:
    """Two processes each use a shard (pinned) and each needs another one; the cache holds two.
    Neither may evict the other's: one download on the node goes ahead within the limit plus one
    shard, its read ends, and the other then finds room. (A pin was known only to its own
    process: the other evicted the shard in use.)"""
    one = ShardCache(str(tmp_path), max_bytes=2 * SHARD, wait_for_room_s=30.0)
    two = ShardCache(str(tmp_path), max_bytes=2 * SHARD, wait_for_room_s=30.0)
    both = threading.Barrier(2, timeout=30)
    peak, errors = [0], []

    def fetch(dest: str) -> None:
        _fill(b"n")(dest)
        peak[0] = max(peak[0], _committed_and_staged(tmp_path))

    def read(cache: ShardCache, using: str, wanted: str) -> None:
        try:
            with cache.acquire(using, _fill(b"u"), size=SHARD) as lease:
                both.wait()  # both shards in use: the cache is full of them
                cache.acquire(wanted, fetch, size=SHARD).release()
                assert os.path.exists(lease.path), f"{using}, in use here, was evicted by the other process"
        except BaseException as exc:  # (a thread's exception would not fail the test)
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(c, u, w)) for c, u, w in ((one, "x", "y"), (two, "z", "w"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert peak[0] <= 3 * SHARD, peak
    assert one.over_limit + two.over_limit == 0
    assert one.room.overdrafts + two.room.overdrafts == 1


def test_an_entry_evicted_by_another_process_while_it_is_verified_is_fetched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process's first use hashes the file; another process evicting it meanwhile used to
    raise FileNotFoundError (an "internal server error" for the trainer)."""
    ShardCache(str(tmp_path), max_bytes=10 * SHARD).acquire("a", _fill(b"a"), size=SHARD).release()
    real = sha256_file

    def evicted_meanwhile(path: str) -> str:
        if not path.endswith(".part"):
            CacheFiles(str(tmp_path)).remove(os.path.basename(path))  # another process's eviction
        return real(path)

    monkeypatch.setattr(cache_module, "sha256_file", evicted_meanwhile)
    other = ShardCache(str(tmp_path), max_bytes=10 * SHARD)  # a process that has not used it yet
    fetched: list[str] = []

    def fetch(dest: str) -> None:
        fetched.append(dest)
        _fill(b"a")(dest)

    with other.acquire("a", fetch, size=SHARD) as lease:
        assert not lease.hit and Path(lease.path).read_bytes() == b"a" * SHARD
    assert len(fetched) == 1


def test_a_dead_process_claim_is_reclaimed(tmp_path: Path) -> None:
    """A process killed mid-download leaves a claim and a staged file: the next process that
    decides on room sees its owner gone (its lock went with it) and removes both."""
    code = (
        "import os, sys\n"
        "from flightfeed.server.storage.cache.shard_cache import ShardCache\n"
        "c = ShardCache(sys.argv[1], max_bytes=1000)\n"
        "def fetch(dest):\n"
        "    open(dest, 'wb').write(b'x' * 500)\n"
        "    print('fetching', flush=True)\n"
        "    sys.stdin.read()\n"
        "c.acquire('k', fetch, size=500)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "fetching"
        cache = ShardCache(str(tmp_path), max_bytes=1000, wait_for_room_s=60.0)
        with cache.acquire("big", _fill(b"b", 600), size=600):  # the node's one download beyond the limit
            small = threading.Thread(target=lambda: cache.acquire("small", _fill(b"s"), size=SHARD).release())
            small.start()  # 500 + 600 + 100: waits for room
            eventually("the download waits for room", lambda: cache.room.waiting == 1, timeout=30)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            small.join(timeout=60)  # 600 + 100: its 500 were reclaimed
            assert not small.is_alive()
        assert cache.claims.reclaimed == 1 and cache.over_limit == 0
        assert not any((tmp_path / ".tmp").iterdir())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _node_disk(directory: Path, pid: int) -> int:
    """Bytes the node's processes occupy in the cache's file system: files (committed and
    staged) plus deleted files still mapped or open by any of them, counted once by inode."""
    files = _files(directory)
    held: dict[int, int] = {}
    for p in _tree(pid):
        try:
            for ino, size in _held_by(directory, p).items():
                held[ino] = max(held.get(ino, 0), size)
        except OSError:  # exited meanwhile
            continue
    return sum(files.values()) + sum(size for ino, size in held.items() if ino not in files)


def test_a_node_of_three_processes_stays_within_its_cache_size_through_a_kill_9(s3: LocalS3, tmp_path: Path) -> None:
    """``--workers 3 --cache-size 16MB`` over 8 shards of ~3 MB on moto S3 (the cache thrashes),
    a shuffled epoch, one worker killed -9 mid-epoch: every row exactly once, and the node's disk
    (its own tmpfs: files, downloads, unlinked files still mapped, bookkeeping) never beyond the
    limit plus one shard. (A process opening a shard another had just evicted failed the read;
    then the disk peaked at 21-26 MB: files evicted under other processes' readers stayed
    mapped, and were downloaded again meanwhile.)"""
    uri = s3_dataset(s3, tmp_path, rows=ROWS, shard_bytes=3_000_000)
    listing = s3.fs().get_file_info(pafs.FileSelector(uri[len("s3://"):]))
    shard = max(i.size for i in listing if i.path.endswith(".arrow"))
    cache, limit = tmp_path / "cache", 16_000_000
    cache.mkdir()
    tmpfs = private_tmpfs_works(str(cache))
    proc, location = start_serve(
        f"d={uri}", "--workers", "3", "--cache-dir", str(cache), "--cache-size", str(limit),
        "--s3-endpoint", s3.endpoint, "--s3-region", s3.region,
        preexec=private_tmpfs(str(cache), 4 * limit) if tmpfs else None,
    )
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):  # (the server has exited)
                peak[0] = max(peak[0], used_bytes(proc.pid, str(cache)) if tmpfs else _node_disk(cache, proc.pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        sampler.start()
        ds = FlightDataset(location, "d", columns=["index"], batch_size=64, shuffle=True, seed=5,
                           options=ReadOptions(streams=3, report_interval=None))
        rows: list[int] = []
        for n, batch in enumerate(ds):
            rows += batch["index"].tolist()
            if n == 8:
                os.kill(action(location, "stats")["cluster"]["workers"][0]["pid"], signal.SIGKILL)
        assert sorted(rows) == list(range(ROWS))
        figures = action(location, "stats")["shard_cache"][0]  # the node's disk; the counts add up
        print(figures)
        assert figures["limit_bytes"] == limit and figures["over_limit"] == 0
    finally:
        stop.set()
        sampler.join(timeout=30)
        proc.kill()
        proc.wait(timeout=30)
    print(f"node disk peak {peak[0]} bytes ({'tmpfs' if tmpfs else '/proc'}) for --cache-size {limit} + shard {shard}")
    assert peak[0] <= limit + shard + _BOOKKEEPING, (peak[0], limit, shard)


def _fill(byte: bytes, size: int = SHARD) -> Callable[[str], None]:
    def fetch(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(byte * size)

    return fetch


def test_a_thrashing_cache_counts_its_redownloads(
    s3: LocalS3, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """8 shards of ~3 MB through a cache of ~2 of them, one stream, shuffled: shards come back
    within the epoch, and /stats, the metric and the dashboard's figures say so. A cache that
    holds the dataset counts none."""
    from flightfeed.server.observe.metrics import ServerMetrics
    from flightfeed.server.observe.snapshot import metrics_snapshot
    from flightfeed.server.testing import running_server

    uri = s3_dataset(s3, tmp_path, rows=ROWS, shard_bytes=3_000_000)
    for size, thrashing in ((7_000_000, True), (64_000_000, False)):
        metrics = ServerMetrics()
        opts = s3.options(tmp_path / f"cache-{size}", cache_size=size, s3_prefetch=False, metrics=metrics)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flightfeed.server"), \
                running_server({"d": uri}, storage=opts, metrics=metrics) as srv:
            # warned at start-up: the shards of one shuffle window do not fit
            assert any("cannot hold the shards of one shuffle window" in r.message for r in caplog.records) == thrashing
            for epoch in range(2):
                ds = FlightDataset(srv.location, "d", columns=["index"], batch_size=64, shuffle=True, seed=3,
                                   options=ReadOptions(streams=1, report_interval=None))
                ds.set_epoch(epoch)
                assert sorted(i for b in ds for i in b["index"].tolist()) == list(range(ROWS))
            stats = metrics_snapshot(srv.server.metrics)
        redownloads = stats["cache"]["redownloads"]
        assert (redownloads > 0) == thrashing, (size, redownloads)
        assert any("is thrashing" in r.message for r in caplog.records) == thrashing
        metric = metrics.registry.get_sample_value("flightfeed_cache_redownloads_total", {"dataset": "d"})
        assert (metric or 0) == redownloads
