"""An HDF5 shard overwritten in place while served (`cp new.h5 served.h5`).

An `.arrow` shard is guarded by a read lease; an HDF5 (or Parquet) shard is read through the
descriptor its library holds open, with no lease: the server read the new file's bytes at the
old layout and served its rows, silently, next to the old file's (a scientist's contiguous,
uncompressed datasets keep their layout when rewritten, so nothing failed). Now every read of
such a shard is followed by a check of the file's size and mtime: a file written since the
catalog was built fails the stream with a ShardError naming the shard, new requests get
StaleState, as for `.arrow`. A file deleted or renamed over keeps being read from its original
inode (consistent rows), as a memory-mapped `.arrow` shard is.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from flightfeed.client import FlightDataset, ReadOptions, StaleState
from flightfeed.server.storage import StorageOptions
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import ShardError

h5py = pytest.importorskip("h5py")

ROWS = 10_000  # per shard: each dataset larger than HDF5's 64 KiB sieve buffer (else it is not read again)


def _write(path: Path, first: int, *, poisoned: bool = False) -> None:
    idx = np.arange(first, first + ROWS, dtype=np.int64)
    with h5py.File(path, "w") as f:  # contiguous, uncompressed: a rewrite keeps the byte layout
        f.create_dataset("idx", data=idx + (10**6 if poisoned else 0))
        f.create_dataset("x", data=np.repeat((idx * 0.5).astype(np.float32)[:, None], 8, axis=1) * (not poisoned))


def _shards(tmp_path: Path) -> Path:
    """Two served shards in ``tmp_path/h5`` and, beside them, ``new.h5``: the second one's rows
    poisoned (another index and x zeros) in a file of the same layout."""
    root = tmp_path / "h5"
    root.mkdir()
    for s in range(2):
        _write(root / f"part{s}.h5", s * ROWS)
    _write(tmp_path / "new.h5", ROWS, poisoned=True)
    return root


def _epoch(location: str) -> list[int]:
    options = ReadOptions(streams=1, report_interval=None)
    ds = FlightDataset(location, "h", batch_size=100, shuffle=False, options=options)
    return [int(i) for b in ds for i in b["idx"]]


def test_an_hdf5_shard_overwritten_in_place_is_never_served(tmp_path: Path) -> None:
    root = _shards(tmp_path)
    assert os.path.getsize(tmp_path / "new.h5") == os.path.getsize(root / "part1.h5")
    storage = StorageOptions(chunk_cache_bytes=1)  # every read goes to the file
    with running_server({"h": str(root)}, storage=storage) as srv:
        assert _epoch(srv.location) == list(range(2 * ROWS))  # both files are open now
        subprocess.run(["cp", str(tmp_path / "new.h5"), str(root / "part1.h5")], check=True, timeout=60)
        # was: no error, rows 10000.. served as 1010000.. (and x zeros): the new file's bytes at the old layout
        with pytest.raises(ShardError, match=r"shard h/part1\.h5 was truncated or overwritten in place while served"):
            _epoch(srv.location)
        with pytest.raises(StaleState, match="changed on disk while served"):
            _epoch(srv.location)


def test_an_hdf5_shard_renamed_over_or_deleted_while_open_keeps_its_rows(tmp_path: Path) -> None:
    root = _shards(tmp_path)
    storage = StorageOptions(chunk_cache_bytes=1)
    with running_server({"h": str(root)}, storage=storage) as srv:
        assert _epoch(srv.location) == list(range(2 * ROWS))
        os.replace(tmp_path / "new.h5", root / "part1.h5")  # a new inode under the name: the open one is read
        os.unlink(root / "part0.h5")
        assert _epoch(srv.location) == list(range(2 * ROWS))
