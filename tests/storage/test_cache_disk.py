"""The shard cache stays inside its disk (docs/large-datasets.md, the shard cache): evicted shards give their space
back (files plus deleted-but-still-mapped bytes stay within ``--cache-size``), and a full disk is
one clear, non-retried error that ``/readyz`` explains."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.wire.errors import DiskFull

ROW_BYTES = 16 << 10
CACHE_SIZE = 20_000_000


def s3_dataset(s3: LocalS3, tmp_path: Path, rows: int = 3000, shard_bytes: int = 6_000_000) -> str:
    """~48 MB in shards of ~6 MB on the S3 service (a manifest: shards are fetched on first read)."""
    src = tmp_path / "src"
    src.mkdir()
    index = np.arange(rows, dtype=np.int64)
    np.savez(src / "rows.npz", index=index, x=np.repeat((index % 251).astype(np.uint8)[:, None], ROW_BYTES, axis=1))
    uri = f"s3://{s3.new_bucket()}/ds"
    settings = ConvertSettings(shard_bytes=shard_bytes, rows_per_batch=32, progress=False, storage=s3.options())
    convert(str(src), uri, settings)
    return uri


def _held_by(directory: Path, pid: int | str = "self") -> dict[int, int]:
    """Inode -> bytes of files under ``directory`` that are deleted yet still mapped or open."""
    held: dict[int, int] = {}
    prefix = str(directory)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith(prefix) and parts[5].rstrip().endswith("(deleted)"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                held[int(parts[4])] = held.get(int(parts[4]), 0) + hi - lo
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target.endswith("(deleted)"):
            held[st.st_ino] = max(held.get(st.st_ino, 0), st.st_size)
    return held


def _files(directory: Path) -> dict[int, int]:
    """Inode -> bytes of shard files in the cache directory (committed and being downloaded)."""
    skip = (".meta", ".lock")
    out: dict[int, int] = {}
    for p in directory.rglob("*"):
        try:
            st = p.stat()
        except FileNotFoundError:  # evicted meanwhile
            continue
        if p.is_file() and not p.name.endswith(skip):
            out[st.st_ino] = st.st_size
    return out


def disk_use(directory: Path) -> tuple[int, int]:
    """``(files, held)``: bytes of the cache's files, and of deleted files this process still maps
    or holds open. Keyed by inode: a file evicted between the two scans counts once (a file's
    size, or its mapped pages when larger)."""
    files, held = _files(directory), _held_by(directory)
    only_held = {ino: size for ino, size in held.items() if ino not in files}
    return sum(files.values()), sum(only_held.values())


def test_evicted_shards_give_their_disk_space_back(s3: LocalS3, tmp_path: Path) -> None:
    uri = s3_dataset(s3, tmp_path)
    cache = tmp_path / "cache"
    metrics = ServerMetrics()
    opts = s3.options(cache, cache_size=CACHE_SIZE, s3_prefetch=False, metrics=metrics)
    peak = {"files": 0, "held": 0, "disk": 0}
    rows = 0
    with running_server({"d": uri}, storage=opts, metrics=metrics) as srv:
        for epoch in range(2):  # two shuffled epochs over 8 shards of ~6 MB through a 20 MB cache
            ds = FlightDataset(srv.location, "d", columns=["index"], batch_size=64, shuffle=True, seed=5,
                               options=ReadOptions(streams=2, report_interval=None))
            ds.set_epoch(epoch)
            for batch in ds:
                rows += len(batch["index"])
                files, held = disk_use(cache)
                peak = {"files": max(peak["files"], files), "held": max(peak["held"], held),
                        "disk": max(peak["disk"], files + held)}
        assert rows == 2 * 3000
        evictions = metrics.registry.get_sample_value("flightfeed_cache_evictions_total", {"dataset": "d"})
    # was: 18.5 MB of files plus 179 MB of evicted shards still mapped, growing every epoch
    assert peak["disk"] <= CACHE_SIZE, peak
    assert evictions is not None and evictions >= 5  # the shards really went through the small cache


def _mount_tmpfs(path: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): no small file system for a full disk")


def test_a_full_disk_is_one_clear_error_and_readyz_says_why(s3: LocalS3, tmp_path: Path) -> None:
    uri = s3_dataset(s3, tmp_path)
    disk = tmp_path / "small-disk"
    _mount_tmpfs(disk, "8m")
    try:
        # the default --cache-size is half of the disk's free space, but the disk fills up anyway
        # (another process writes to it): only ~1 MB is left for 6 MB shards
        (disk / "filler").write_bytes(b"\0" * (7 << 20))
        opts = s3.options(disk / "cache", cache_size=CACHE_SIZE, s3_prefetch=False)
        catalog = open_catalog({"d": uri}, opts)
        with running_server(catalog) as srv:
            ds = FlightDataset(srv.location, "d", batch_size=64, options=ReadOptions(report_interval=None))
            with pytest.raises(DiskFull) as info:
                next(iter(ds))
            text = str(info.value)
            assert f"shard cache {disk / 'cache'} is full" in text and "needs" in text and "bytes" in text
            assert "S3 request failed" not in text and "attempts" not in text
            assert ds.stats()["retries"] == 0  # not retried for the client's 30 s: retrying makes no room
            # /readyz (the plain health action behind it) says why
            client = flight.FlightClient(srv.location)
            with pytest.raises(flight.FlightUnavailableError, match=r"not ready: the disk of the shard cache"):
                list(client.do_action(flight.Action("health", b"")))
            from flightfeed.server.sidecar import LocalSource, start_sidecar

            source = LocalSource(srv.metrics, srv.catalog, srv.location)
            handle = start_sidecar(source, "127.0.0.1", 0)
            try:
                with pytest.raises(urllib.error.HTTPError) as answer:
                    urllib.request.urlopen(f"{handle.url}/readyz", timeout=30)
                assert answer.value.code == 503
                assert "disk of the shard cache" in json.loads(answer.value.read())["reason"]
            finally:
                handle.stop()
                source.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
