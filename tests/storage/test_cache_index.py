"""The shard cache's in-memory index: a download lists nothing (its cost does not grow with the
number of cached shards), and caches sharing one directory (other processes) see each other's
commits, touches and evictions through the journal, also across its rotation."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flightfeed.server.storage.cache.files import CacheFiles
from flightfeed.server.storage.cache.shard_cache import ShardCache

REPO = Path(__file__).resolve().parents[2]


def _fetch(size: int, fill: int = 1) -> Callable[[str], None]:
    def fetch(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(bytes([fill]) * size)

    return fetch


def _on_disk(directory: Path) -> dict[str, int]:
    """name -> size of the committed entries (data file plus metadata), from the directory."""
    return {name: size for name, size, _, _ in CacheFiles(str(directory)).listing()}


def _download_costs(directory: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, float]:
    """(directory scans, stats per download) over ``n`` downloads into a cache of ``n // 2``
    entries: the second half of them each evicts one."""
    cache = ShardCache(str(directory), max_bytes=(n // 2) * 100)
    calls = {"scandir": 0, "stat": 0}
    real_scandir, real_stat = os.scandir, os.stat

    def scandir(*args: Any, **kwargs: Any) -> Any:
        calls["scandir"] += 1
        return real_scandir(*args, **kwargs)

    def stat(*args: Any, **kwargs: Any) -> Any:
        calls["stat"] += 1
        return real_stat(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(os, "scandir", scandir)
        mp.setattr(os, "stat", stat)
        for i in range(n):
            cache.acquire(f"s3://bucket/shard-{i:05d}.arrow", _fetch(100), size=100).release()
    assert len(_on_disk(directory)) == n // 2
    assert cache.total_bytes() == (n // 2) * 100
    return calls["scandir"], calls["stat"] / n


def test_a_download_costs_the_same_however_many_shards_are_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_scans, small_stats = _download_costs(tmp_path / "small", 40, monkeypatch)
    large_scans, large_stats = _download_costs(tmp_path / "large", 400, monkeypatch)
    assert small_scans == large_scans == 0  # the directory is listed once, at start
    assert large_stats <= small_stats + 0.5  # (a listing per download: ~1 stat per cached entry)


def test_two_caches_on_one_directory_see_each_others_commits_and_evictions(tmp_path: Path) -> None:
    one = ShardCache(str(tmp_path), max_bytes=300)
    two = ShardCache(str(tmp_path), max_bytes=300)  # another process: nothing in memory is shared
    one.acquire("a", _fetch(100), size=100).release()
    one.acquire("b", _fetch(100), size=100).release()
    two.acquire("c", _fetch(100), size=100).release()
    assert two.total_bytes() == 300
    two.acquire("a", _fetch(100), size=100).release()  # a hit there: a is used again
    scans = (one.index.rescans, two.index.rescans)
    two.acquire("d", _fetch(100), size=100).release()  # full: evicts b, the least recently used
    one.acquire("e", _fetch(100), size=100).release()  # full again: evicts c
    names = {CacheFiles.name_for(k) for k in ("a", "d", "e")}
    assert set(_on_disk(tmp_path)) == names
    assert one.total_bytes() == two.total_bytes() == 300
    assert (one.index.rescans, two.index.rescans) == scans  # from the journal, not by listing


def test_the_journal_rotates_and_every_cache_catches_up(tmp_path: Path) -> None:
    one = ShardCache(str(tmp_path), max_bytes=1000)
    two = ShardCache(str(tmp_path), max_bytes=1000)
    for cache in (one, two):
        cache.index.rotate_min_lines = 8
    for i in range(60):
        (one if i % 3 else two).acquire(f"k{i}", _fetch(100), size=100).release()
    disk = _on_disk(tmp_path)
    assert sum(disk.values()) == 1000
    assert os.path.getsize(tmp_path / ".journal") < 60 * 3 * 40  # rotated: not every line is kept
    for cache in (one, two):
        assert cache.index.rescans > 1
        assert cache.total_bytes() == 1000
        assert {name for name, _, _ in cache.index.oldest()} == set(disk)


def test_concurrent_caches_agree_with_the_directory_across_rotations(tmp_path: Path) -> None:
    caches = [ShardCache(str(tmp_path), max_bytes=2000) for _ in range(3)]  # 3 "processes"
    for cache in caches:
        cache.index.rotate_min_lines = 16  # rotate often, while the others append

    errors: list[BaseException] = []

    def epoch(i: int) -> None:
        try:
            for k in range(120):
                caches[i].acquire(f"k{(k * 7 + i * 31) % 150}", _fetch(100), size=100).release()
        except BaseException as exc:  # (a thread's exception would not fail the test)
            errors.append(exc)

    threads = [threading.Thread(target=epoch, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    disk = _on_disk(tmp_path)
    assert sum(disk.values()) <= 2000 + 2 * 100  # (reservations are per process: one shard each over)
    for cache in caches:
        assert cache.total_bytes() == sum(disk.values())  # (reads the others' last lines)
        assert cache.index.rescans > 1
        assert {name for name, _, _ in cache.index.oldest()} == set(disk)


def test_files_removed_behind_the_index_are_found_when_room_runs_out(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=300, wait_for_room_s=0.0)
    leases = [cache.acquire(k, _fetch(100), size=100) for k in ("a", "b", "c")]  # all pinned
    CacheFiles(str(tmp_path)).remove(CacheFiles.name_for("c"))  # by hand: the journal never hears
    with cache.acquire("d", _fetch(100), size=100) as lease:  # fits once the directory is listed
        assert not lease.hit
    assert cache.total_bytes() == 300
    for lease in leases:
        lease.release()


_CHILD = """
import sys
from flightfeed.server.storage.cache.shard_cache import ShardCache
cache = ShardCache(sys.argv[1], max_bytes=1000)
for i in range(6):
    with cache.acquire(f"child-{i}", lambda dest: open(dest, "wb").write(b"c" * 100), size=100):
        pass
"""


def test_another_process_commits_are_counted(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=1000)
    for i in range(5):
        cache.acquire(f"parent-{i}", _fetch(100), size=100).release()
    paths = [str(REPO / p) for p in ("server", "client", "proto_schemas", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], env=env, check=True, timeout=60)
    assert sum(_on_disk(tmp_path).values()) == 1000  # the child saw the parent's 500 bytes: evicted one
    assert cache.total_bytes() == 1000  # and the parent sees the child's commits and eviction
    cache.acquire("parent-5", _fetch(100), size=100).release()
    assert sum(_on_disk(tmp_path).values()) == 1000
    assert cache.total_bytes() == 1000
