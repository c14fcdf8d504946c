"""The shuffled order does not depend on which columns are read (``data.shuffle_sizing``): the
default block and window sizes come from the whole row, so a label-only pass, a second reader of
fewer columns and a packed read of the token column see the order a full-row reader sees. Rows of
16 KiB make the difference visible: sized by ``id`` alone a block was the whole dataset (600 rows),
sized by the whole row it is 511 rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.client import FlightDataset, Pack, ReadOptions
from flightfeed.server.testing import RunningServer, running_server

ROWS = 600
WIDE = 16 << 10  # bytes of the wide column per row
STRIDE = 1000  # token ids name their document: document d's tokens are d * STRIDE + [0, len)
BATCH = 64


def _write(root: Path) -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 6, size=ROWS)  # no empty document: each one shows in the token stream
    ids = np.arange(ROWS, dtype=np.int64)
    values = np.repeat(ids * STRIDE, lengths) + (np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths,
                                                                                           lengths))
    tokens = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(lengths)], pa.int32()), pa.array(values, pa.int32()))
    wide = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(ROWS * WIDE, np.uint8)), WIDE)
    table = pa.table({"id": ids, "tokens": tokens, "wide": wide})
    for s, (lo, hi) in enumerate([(0, 350), (350, ROWS)]):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), table.schema) as writer:
            writer.write_table(table.slice(lo, hi - lo), max_chunksize=100)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("wide")
    _write(root)
    with running_server({"wide": str(root)}) as srv:
        yield srv


def _reader(server: RunningServer, **kw: Any) -> FlightDataset:
    return FlightDataset(server.location, "wide", batch_size=BATCH, seed=0,
                         options=kw.pop("options", ReadOptions(report_interval=None)), **kw)


def _first_ids(ds: FlightDataset) -> tuple[list[int], dict[str, Any]]:
    it = iter(ds)
    ids = next(it)["id"].tolist()
    state = ds.state_dict()
    del it
    ds.close()
    return ids, state


def test_the_same_order_whatever_columns_are_read(server: RunningServer) -> None:
    """A 16 KiB-row dataset read with shuffle and seed 0: the first indices with all columns and with
    ``columns=["id"]`` are the same (they differed: blocks of 511 rows against one block of 600)."""
    full, full_state = _first_ids(_reader(server))
    ids, ids_state = _first_ids(_reader(server, columns=["id"]))
    assert ids == full
    assert (ids_state["block_rows"], ids_state["buffer_rows"]) == (full_state["block_rows"], full_state["buffer_rows"])
    assert full_state["block_rows"] == 511  # sized by the whole row (8 MiB / ~16 KiB), not id's 8 bytes
    for epoch in (1, 2):
        a, b = _reader(server, columns=["id"]), _reader(server, columns=["id", "tokens"])
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert [i for x in a for i in x["id"].tolist()] == [i for x in b for i in x["id"].tolist()]


def test_a_packed_read_sees_its_documents_in_the_row_order(server: RunningServer) -> None:
    """Documents are shuffled like rows: a packed read of the token column takes its documents in
    the order a row reader of any columns takes its rows (it sized blocks by the token column)."""
    rows = [i for b in _reader(server) for i in b["id"].tolist()]  # all columns: the training order
    opts = ReadOptions(pack=Pack(column="tokens", seq_len=8, pad_tail=True, pad_id=-1), report_interval=None)
    windows = np.concatenate([b["tokens"].numpy() for b in _reader(server, options=opts)])
    stream = np.r_[windows[:, :-1].ravel(), windows[-1, -1]]
    docs = stream[stream >= 0] // STRIDE
    order = docs[np.r_[True, docs[1:] != docs[:-1]]]
    assert order.tolist() == rows


def test_a_full_row_checkpoint_resumes_exactly(server: RunningServer) -> None:
    """A full-column reader's defaults did not change: its checkpoint (the resolved sizes inside)
    loads into a fresh reader, which serves the rest of the epoch exactly."""
    whole = [i for b in _reader(server, columns=["id", "tokens", "wide"]) for i in b["id"].tolist()]
    writer = _reader(server)
    it = iter(writer)
    head = [i for _ in range(3) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(writer.state_dict()))
    del it
    writer.close()
    resumed = _reader(server)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in b["id"].tolist()] == whole
