"""The shard cache: hits and misses, LRU eviction that spares pinned shards, verification on
reuse (corrupt copies re-fetched), restarts, atomic writes and one download per shard."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.cache.shard_cache import ShardCache, default_cache_size, shared_cache
from flightfeed.wire.errors import StorageError

Count = Callable[[str, str], float]


class Origin:
    """A fake remote store: key -> bytes, counting downloads per key."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.downloads: dict[str, int] = {}
        self._lock = threading.Lock()

    def put(self, key: str, size: int, fill: int | None = None) -> bytes:
        data = bytes([fill if fill is not None else len(self.objects) % 251]) * size
        self.objects[key] = data
        return data

    def fetcher(self, key: str) -> Callable[[str], None]:
        def fetch(dest: str) -> None:
            with self._lock:
                self.downloads[key] = self.downloads.get(key, 0) + 1
            with open(dest, "wb") as f:
                f.write(self.objects[key])

        return fetch


def _data_files(directory: Path) -> list[str]:
    return sorted(p for p in os.listdir(directory) if not p.startswith(".") and not p.endswith(".meta"))


def test_miss_then_hit(tmp_path: Path, metrics: ServerMetrics, count: Count) -> None:
    origin = Origin()
    data = origin.put("s3://b/a.arrow", 1000)
    cache = ShardCache(str(tmp_path), 10_000, metrics, dataset="ds")
    with cache.acquire("s3://b/a.arrow", origin.fetcher("s3://b/a.arrow"), size=1000) as lease:
        assert not lease.hit
        assert Path(lease.path).read_bytes() == data
        assert lease.path.endswith("a.arrow")  # keeps the suffix: readers pick the format from it
    with cache.acquire("s3://b/a.arrow", origin.fetcher("s3://b/a.arrow"), size=1000) as lease:
        assert lease.hit
    assert origin.downloads == {"s3://b/a.arrow": 1}
    assert count("cache_misses", "ds") == 1
    assert count("cache_hits", "ds") == 1
    assert count("cache_bytes", "ds") == 1000
    assert count("cache_download_seconds", "ds") > 0


def test_eviction_spares_pinned_shards(tmp_path: Path, metrics: ServerMetrics, count: Count) -> None:
    origin = Origin()
    for key in ("a", "b", "c"):
        origin.put(key, 100)
    cache = ShardCache(str(tmp_path), 250, metrics, dataset="ds")
    evicted: list[str] = []
    pinned = cache.acquire("a", origin.fetcher("a"), size=100, on_evict=lambda: evicted.append("a"))
    cache.acquire("b", origin.fetcher("b"), size=100, on_evict=lambda: evicted.append("b")).release()
    with cache.acquire("c", origin.fetcher("c"), size=100):  # 300 > 250: one must go, not the pinned one
        pass
    assert evicted == ["b"]
    assert os.path.exists(pinned.path)
    assert cache.total_bytes() <= 250
    assert count("cache_evictions", "ds") == 1
    assert cache.pinned() == ["a"]
    pinned.release()
    assert cache.pinned() == []
    # b comes back on demand (a miss), evicting an unpinned one
    with cache.acquire("b", origin.fetcher("b"), size=100) as lease:
        assert not lease.hit
    assert origin.downloads["b"] == 2


def test_a_cache_full_of_pinned_shards_never_fails_a_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Shards in use that leave no room: one download goes ahead within the limit plus one shard;
    past that only after ``wait_for_room_s``, counted and logged (it used to fail the read)."""
    origin = Origin()
    for key in ("a", "b", "c"):
        origin.put(key, 100)
    origin.put("huge", 1000)
    cache = ShardCache(str(tmp_path), 150, wait_for_room_s=0.0)
    with (
        caplog.at_level(logging.WARNING, logger="flightfeed.server"),
        cache.acquire("a", origin.fetcher("a"), size=100),
        cache.acquire("b", origin.fetcher("b"), size=100),
    ):
        assert cache.over_limit == 0  # 200 bytes: within 150 + one shard
        with cache.acquire("c", origin.fetcher("c"), size=100):
            assert cache.over_limit == 1  # 300 bytes: beyond, and said so
    assert any("Raise --cache-size" in r.message for r in caplog.records)
    with pytest.raises(StorageError, match="larger than the shard cache"):
        cache.acquire("huge", origin.fetcher("huge"), size=1000)


def test_restart_reuses_verified_entries(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 5000)
    ShardCache(str(tmp_path), 10**6).acquire("a", origin.fetcher("a"), size=5000).release()
    restarted = ShardCache(str(tmp_path), 10**6)  # a new process, same directory
    with restarted.acquire("a", origin.fetcher("a"), size=5000) as lease:
        assert lease.hit
        assert lease.sha256 == hashlib.sha256(origin.objects["a"]).hexdigest()
    assert origin.downloads["a"] == 1


def test_corrupt_cached_file_is_fetched_again(tmp_path: Path) -> None:
    origin = Origin()
    data = origin.put("a", 5000)
    lease = ShardCache(str(tmp_path), 10**6).acquire("a", origin.fetcher("a"), size=5000)
    lease.release()
    with open(lease.path, "r+b") as f:  # same size, different bytes
        f.seek(1234)
        f.write(b"\xff\xfe")
    restarted = ShardCache(str(tmp_path), 10**6)
    with restarted.acquire("a", origin.fetcher("a"), size=5000) as again:
        assert not again.hit
        assert Path(again.path).read_bytes() == data
    assert origin.downloads["a"] == 2


def test_truncated_file_and_changed_object_are_fetched_again(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 5000)
    cache = ShardCache(str(tmp_path), 10**6)
    lease = cache.acquire("a", origin.fetcher("a"), size=5000, version="v1")
    lease.release()
    os.truncate(lease.path, 10)
    with cache.acquire("a", origin.fetcher("a"), size=5000, version="v1") as again:
        assert not again.hit
        assert os.path.getsize(again.path) == 5000
    data = origin.put("a", 5000, fill=7)  # the remote object changed
    with cache.acquire("a", origin.fetcher("a"), size=5000, version="v2") as fresh:
        assert not fresh.hit
        assert Path(fresh.path).read_bytes() == data
    assert origin.downloads["a"] == 3


def test_concurrent_requests_download_once(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 100_000)
    cache = ShardCache(str(tmp_path), 10**6)
    started = threading.Barrier(8)
    fetch = origin.fetcher("a")

    def slow_fetch(dest: str) -> None:
        threading.Event().wait(0.05)  # widen the window for a second download
        fetch(dest)

    def worker(_: int) -> bool:
        started.wait()
        with cache.acquire("a", slow_fetch, size=100_000) as lease:
            return lease.hit

    with ThreadPoolExecutor(8) as pool:
        hits = list(pool.map(worker, range(8)))
    assert origin.downloads["a"] == 1
    assert sorted(hits) == [False] + [True] * 7


def test_failed_and_truncated_downloads_leave_nothing(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), 10**6)

    def broken(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(b"partial")
        raise StorageError("connection reset")

    with pytest.raises(StorageError, match="connection reset"):
        cache.acquire("a", broken, size=100)

    def short(dest: str) -> None:
        with open(dest, "wb") as f:
            f.write(b"x" * 10)

    with pytest.raises(StorageError, match="truncated"):
        cache.acquire("a", short, size=100)
    assert _data_files(tmp_path) == []
    assert os.listdir(tmp_path / ".tmp") == []


def test_manifest_checksum_mismatch(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 100)
    cache = ShardCache(str(tmp_path), 10**6)
    with pytest.raises(StorageError, match="manifest"):
        cache.acquire("a", origin.fetcher("a"), size=100, sha256="0" * 64)
    good = hashlib.sha256(origin.objects["a"]).hexdigest()
    with cache.acquire("a", origin.fetcher("a"), size=100, sha256=good) as lease:
        assert lease.sha256 == good


def test_recovery_drops_interrupted_writes(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 100)
    ShardCache(str(tmp_path), 10**6).acquire("a", origin.fetcher("a"), size=100).release()
    (tmp_path / "0123456789abcdef-orphan.arrow").write_bytes(b"data without meta")
    stale = tmp_path / ".tmp" / "x.arrow.999999999.deadbeef.part"  # a pid that cannot exist
    stale.write_bytes(b"half a download")
    restarted = ShardCache(str(tmp_path), 10**6)
    assert len(_data_files(tmp_path)) == 1
    assert not stale.exists()
    with restarted.acquire("a", origin.fetcher("a"), size=100) as lease:
        assert lease.hit


def test_evicted_lease_reacquire(tmp_path: Path) -> None:
    origin = Origin()
    origin.put("a", 100)
    origin.put("b", 100)
    cache = ShardCache(str(tmp_path), 150)
    lease = cache.acquire("a", origin.fetcher("a"), size=100)
    lease.release()
    again = cache.reacquire(lease)
    assert again is not None
    assert again.hit
    again.release()
    cache.acquire("b", origin.fetcher("b"), size=100).release()  # evicts a
    assert cache.reacquire(lease) is None


def test_default_size_and_shared_instances(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_SHARED", {})
    size = default_cache_size(str(tmp_path))
    assert size > 0
    one = shared_cache(str(tmp_path / "c"), 1000)
    assert shared_cache(str(tmp_path / "c")) is one
    assert one.max_bytes == 1000


def test_per_shard_locks_do_not_outlive_their_users(tmp_path: Path) -> None:
    """A lock per shard key serialises its download; it goes once no thread wants the key (a
    dataset of 100,000 shards kept one per shard ever read)."""
    origin = Origin()
    keys = [f"s3://b/{i}.arrow" for i in range(50)]
    for key in keys:
        origin.put(key, 100)
    cache = ShardCache(str(tmp_path), 2_000)

    def read(key: str) -> None:
        with cache.acquire(key, origin.fetcher(key), size=100):
            pass

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(read, keys * 3))
    assert cache._key_locks._locks == {}
