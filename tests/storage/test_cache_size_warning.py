"""A ``--cache-size`` the cache's disk cannot hold (more than its free space plus what the cache
already holds) is said at start-up, in one line naming the sizes: the disk would fill (``DiskFull``)
before the limit evicted anything (docs/operations.md, the shard cache)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.cache.space import oversized_message
from flightfeed.server.testing.local_s3 import LocalS3
from tests.storage.test_cache_disk import s3_dataset
from tests.support.processes import start_serve

PETABYTE = 10**15


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "--cache-size" in r.getMessage()]


def test_a_cache_size_beyond_the_free_space_warns_once_naming_the_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    free = shutil.disk_usage(tmp_path).free
    with caplog.at_level(logging.WARNING, logger="flightfeed.server"):
        cache = ShardCache(str(tmp_path / "cache"), max_bytes=free + PETABYTE)
        cache.close()
    (line,) = _warnings(caplog)
    assert "\n" not in line
    assert line.startswith(f"--cache-size {(free + PETABYTE) / 1e9:,.1f} GB is more than the shard cache's disk holds")
    assert str(tmp_path / "cache") in line and "GB free" in line and "lower --cache-size below" in line


def test_a_cache_size_that_fits_and_the_default_say_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="flightfeed.server"):
        ShardCache(str(tmp_path / "a"), max_bytes=1_000_000).close()
        ShardCache(str(tmp_path / "b")).close()  # the default: half the free disk
    assert _warnings(caplog) == []
    assert oversized_message(str(tmp_path), 1_000_000, 0) is None


def test_what_the_cache_already_holds_counts_as_room(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert oversized_message(str(tmp_path), free + 10**9, cached=2 * 10**9) is None
    assert oversized_message(str(tmp_path), free + 10**12, cached=2 * 10**9) is not None


def test_flightfeed_serve_warns_at_start_up(s3: LocalS3, tmp_path: Path) -> None:
    uri = s3_dataset(s3, tmp_path, rows=200, shard_bytes=100_000)
    cache = tmp_path / "cache"
    proc, _ = start_serve(
        f"d={uri}", "--cache-dir", str(cache), "--cache-size", "10000TB",
        "--s3-endpoint", s3.endpoint, "--s3-region", s3.region,
    )
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if "--cache-size" in line]
    assert len(lines) == 1, err
    assert "WARNING" in lines[0]
    assert "--cache-size 10,000,000.0 GB is more than the shard cache's disk holds" in lines[0]
