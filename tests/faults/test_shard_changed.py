"""A shard truncated or overwritten in place while served (docs/large-datasets.md, shards changed or corrupted).

A memory-mapped shard that another process truncates raises SIGBUS on the next access, which
killed the whole server. Now: the server process survives, the stream reading the dataset fails
with an error naming the shard, the dataset is marked changed (new requests get StaleState),
other datasets keep serving, and the event is logged and counted.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pytest

from flightfeed.client import FlightDataset, ReadOptions, StaleState
from flightfeed.wire.errors import ShardError
from tests.support.datasets import SMALL_LAYOUT, SMALL_ROWS, write_dataset
from tests.support.processes import start_serve

ROW_BYTES = 16 << 10


def _write_big(root: Path, shards: int = 3, rows: int = 512) -> None:
    """``shards`` files of ``rows`` rows of 16 KiB (8 MiB each), batches of 64 rows."""
    root.mkdir(parents=True, exist_ok=True)
    tensor = pa.fixed_shape_tensor(pa.uint8(), [ROW_BYTES])
    schema = pa.schema([("blob", tensor), ("index", pa.int64())])
    for s in range(shards):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as writer:
            for lo in range(0, rows, 64):
                idx = np.arange(s * rows + lo, s * rows + lo + 64, dtype=np.int64)
                flat = pa.array(np.repeat((idx % 251).astype(np.uint8), ROW_BYTES))
                blob = pa.ExtensionArray.from_storage(tensor, pa.FixedSizeListArray.from_arrays(flat, ROW_BYTES))
                writer.write_batch(pa.record_batch([blob, pa.array(idx)], schema=schema))


@contextmanager
def _serve(*datasets: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, location = start_serve(*datasets, "--message-size", "256KiB")
    try:
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)


def _cp(src: Path, dst: Path) -> None:
    subprocess.run(["cp", str(src), str(dst)], check=True, timeout=60)


def _truncate(src: Path, dst: Path) -> None:
    os.truncate(dst, 1000)


@pytest.mark.parametrize("shuffle", [False, True], ids=["stored", "shuffled"])
@pytest.mark.parametrize("change", [_cp, _truncate], ids=["cp", "truncate"])
def test_a_shard_changed_in_place_fails_its_stream_not_the_server(
    tmp_path: Path, change: Callable[[Path, Path], None], shuffle: bool
) -> None:
    big, small = tmp_path / "big", tmp_path / "small"
    _write_big(big)
    write_dataset(small, SMALL_LAYOUT)
    victim = big / "part-00002.arrow"  # the stored-order stream reaches it last
    with _serve(f"big={big}", f"small={small}") as (proc, location):
        client = flight.connect(location)
        ds = FlightDataset(
            location,
            "big",
            batch_size=16,
            shuffle=shuffle,
            options=ReadOptions(streams=1, report_interval=None),
        )
        it = iter(ds)
        assert len(next(it)["index"]) == 16
        change(big / "part-00000.arrow", victim)  # cp of another shard, or a truncate
        # the run in flight fails with ShardError; a run requested after the change with StaleState
        with pytest.raises((ShardError, StaleState)) as failed:
            for _ in it:  # the epoch must not end as if it were fine
                pass
        # the shard by dataset and relative name, never the server's path (docs/operations.md)
        assert "big/part-00002.arrow" in str(failed.value) and str(big) not in str(failed.value)
        assert proc.poll() is None, "the server process died"

        # the other dataset still serves, every row
        other = FlightDataset(location, "small", batch_size=32, options=ReadOptions(report_interval=None))
        rows = [i for b in other for i in b["index"]]
        assert sorted(int(i) for i in rows) == list(range(SMALL_ROWS))
        # the changed one is refused with StaleState naming the shard, for new epochs
        with pytest.raises(StaleState, match=r"part-00002\.arrow"):
            next(iter(FlightDataset(location, "big", batch_size=64, options=ReadOptions(report_interval=None))))
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        assert stats["io"]["datasets"]["big"]["shard_changes"] == 1
        assert "small" not in stats["io"]["datasets"] or stats["io"]["datasets"]["small"]["shard_changes"] == 0
        client.close()
        assert proc.poll() is None
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "part-00002.arrow was truncated or overwritten in place while served" in log
