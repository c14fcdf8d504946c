"""A shard replaced on disk while the open-file bound had it closed (docs/large-datasets.md, many shards).

With more shards than ``--max-open-shards``, a shard is closed after use and opened again when
read. No read lease guards it while it is closed, so the check happens on reopening: the file's
size, mtime and inode must be those the catalog was built from. A file overwritten in place
(``cp`` onto it) or replaced (a new file renamed over it) is never served: the stream reading it
fails with a ShardError naming the shard, new requests get StaleState, the server keeps running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flightfeed.client import FlightDataset, ReadOptions, StaleState
from flightfeed.wire.errors import ShardError
from tests.support.datasets import write_dataset
from tests.support.processes import start_serve

SHARDS = 40
BOUND = 16


@contextmanager
def _serve(root: Path, small: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, location = start_serve(f"d={root}", "--max-open-shards", str(BOUND), "--small-shard-size", small)
    try:
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)


def _epoch(location: str, shuffle: bool) -> list[int]:
    options = ReadOptions(streams=1, report_interval=None)
    ds = FlightDataset(location, "d", batch_size=10, shuffle=shuffle, options=options)
    return [int(i) for b in ds for i in b["index"]]


def _overwrite(victim: Path, other: Path) -> None:
    subprocess.run(["cp", str(other), str(victim)], check=True, timeout=60)  # same inode, new bytes


def _rename_over(victim: Path, other: Path) -> None:
    tmp = victim.with_suffix(".new")
    shutil.copyfile(other, tmp)
    os.replace(tmp, victim)  # a new inode under the old name


def _open_under(pid: int, path: Path) -> bool:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:  # closed since the listing (a socket, a pipe, another shard)
            continue
    return False


@pytest.mark.parametrize("small", ["0", "1MiB"], ids=["mapped", "read-whole"])
@pytest.mark.parametrize("change", [_overwrite, _rename_over], ids=["cp", "rename"])
def test_a_shard_replaced_while_closed_is_found_on_reopen(
    tmp_path: Path, change: Callable[[Path, Path], None], small: str
) -> None:
    write_dataset(tmp_path / "d", [[10]] * SHARDS)
    write_dataset(tmp_path / "other", [[12]])  # another size: the file system's mtime may be too coarse
    victim, other = tmp_path / "d" / "part-00000.arrow", tmp_path / "other" / "part-00000.arrow"
    with _serve(tmp_path / "d", small) as (proc, location):
        assert sorted(_epoch(location, shuffle=False)) == list(range(SHARDS * 10))
        assert not _open_under(proc.pid, victim)  # the bound closed it: 39 shards were read after it
        change(victim, other)
        with pytest.raises(ShardError, match=r"part-00000\.arrow"):
            _epoch(location, shuffle=True)  # every shuffled epoch reads shard 0 again
        assert proc.poll() is None, "the server process died"
        with pytest.raises(StaleState, match=r"part-00000\.arrow"):
            _epoch(location, shuffle=False)
        assert proc.poll() is None
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "part-00000.arrow was" in log and "while served" in log and "found on reopening it" in log
