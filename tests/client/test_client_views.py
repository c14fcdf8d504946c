"""Views on the wire, end to end (docs/wire-views.md): the four reader/server pairs that can be
tested, the tensors a shuffled read gives (exactly a stored read's, per row), and no copy on the
client where the received rows lie back to back.

"Old" means: the reader leaves ``ReadCommand.views`` unset (an old client), or the server sends
plain columns whatever the reader says (an old server ignores the unknown field 31: here the
server's ``views_wanted`` answers False, the one decision a server before views lacks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
import torch

import flightfeed.client._receive.lanes as lanes_module
import flightfeed.server.request.service as service_module
import flightfeed.server.request.streaming as streaming_module
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._receive.views import plain_batch
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from tests.support.wide_data import (
    WIDE_ROWS,
    WIDE_SCHEMA,
    check_wide_table,
    wide_image,
    wide_odd,
    wide_small,
    wide_tokens,
    wide_vec,
    write_wide_dataset,
)

VIEWED = {"image", "odd", "vec"}


@pytest.fixture(scope="module")
def wide_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("wide")
    write_wide_dataset(root)
    with running_server({"wide": str(root)}) as srv:
        yield srv


def _raw_read(location: str, views: bool, shuffle: bool = True) -> list[pa.RecordBatch]:
    """The messages a bare pyarrow Flight client receives for a ReadCommand (``views`` set or not)."""
    cmd = ReadCommand(version=WIRE_VERSION, dataset="wide", seed=1, world_size=1, batch_rows=10, streams=1,
                      num_workers=1, message_rows=60, views=views)
    cmd.shuffle.enabled = shuffle
    client = flight.FlightClient(location)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    out: list[pa.RecordBatch] = []
    for ep in info.endpoints:
        reader = client.do_get(ep.ticket)
        out.extend(chunk.data for chunk in reader if chunk.data is not None)
    client.close()
    return out


def _viewed(batch: pa.RecordBatch) -> set[str]:
    return {f.name for f in batch.schema if pa.types.is_binary_view(f.type)}



def _check_tensors(batch: dict[str, Any]) -> None:
    """The tensors a read gives today, per column: dtype, shape (fixed_shape_tensor, ``shape``
    metadata), strings, ragged as nested."""
    idx = batch["index"].numpy()
    n = len(idx)
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (n, 64, 64, 4)
    assert (batch["image"].reshape(n, -1).numpy() == wide_image(idx)).all()
    assert batch["odd"].shape == (n, 16_387) and (batch["odd"].numpy() == wide_odd(idx)).all()
    assert batch["vec"].dtype == torch.float32 and batch["vec"].shape == (n, 41, 100)
    assert (batch["vec"].reshape(n, -1).numpy() == wide_vec(idx)).all()
    assert batch["small"].dtype == torch.int16 and (batch["small"].numpy() == wide_small(idx)).all()
    assert batch["name"] == [f"row-{i}" for i in idx]
    tokens = batch["tokens"]
    assert tokens.is_nested
    assert [t.tolist() for t in tokens.unbind()] == [wide_tokens(int(i)) for i in idx]


def _read(location: str, shuffle: bool, seen: list[set[str]], monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    def spy(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(_viewed(batch))
        return plain_batch(batch)

    monkeypatch.setattr(lanes_module, "plain_batch", spy)
    ds = FlightDataset(location, "wide", batch_size=10, shuffle=shuffle, seed=2,
                       options=ReadOptions(streams=2, message_rows=40, report_interval=None))
    try:
        return list(ds)
    finally:
        ds.close()


def test_new_client_new_server_shuffled_views_give_the_tensors_of_today(
    wide_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[set[str]] = []
    shuffled = _read(wide_server.location, True, seen, monkeypatch)
    assert seen and all(s == VIEWED for s in seen)  # every message's wide columns came as views
    rows = [i for b in shuffled for i in b["index"].tolist()]
    assert sorted(rows) == list(range(WIDE_ROWS)) and rows != list(range(WIDE_ROWS))
    for b in shuffled:
        _check_tensors(b)
    seen.clear()
    stored = _read(wide_server.location, False, seen, monkeypatch)
    assert seen and all(s == set() for s in seen)  # stored order: plain, as before
    for b in stored:
        _check_tensors(b)


def test_new_client_old_server_reads_plain_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (service_module, streaming_module):
        monkeypatch.setattr(module, "views_wanted", lambda read: False)
    write_wide_dataset(tmp_path / "wide")
    seen: list[set[str]] = []
    with running_server({"wide": str(tmp_path / "wide")}) as old:  # a server of its own (no shared messages)
        batches = _read(old.location, True, seen, monkeypatch)
    assert seen and all(s == set() for s in seen)
    assert sorted(i for b in batches for i in b["index"].tolist()) == list(range(WIDE_ROWS))
    for b in batches:
        _check_tensors(b)


def test_old_client_new_server_gets_plain_columns(wide_server: RunningServer) -> None:
    batches = _raw_read(wide_server.location, views=False)
    assert batches and all(not _viewed(b) and b.schema.equals(WIDE_SCHEMA) for b in batches)
    for b in batches:
        check_wide_table(b, np.asarray(b.column("index")).tolist())


def test_generic_flight_client_gets_plain_columns(wide_server: RunningServer) -> None:
    client = flight.FlightClient(wide_server.location)
    info = client.get_flight_info(flight.FlightDescriptor.for_path("wide"))
    table = pa.concat_tables([client.do_get(ep.ticket).read_all() for ep in info.endpoints])
    client.close()
    assert table.schema.equals(WIDE_SCHEMA)
    check_wide_table(table, list(range(WIDE_ROWS)))


def test_received_rows_back_to_back_become_tensors_without_a_copy(wide_server: RunningServer) -> None:
    batches = _raw_read(wide_server.location, views=True)
    assert batches and all(_viewed(b) == VIEWED for b in batches)
    for b in batches:
        plain = plain_batch(b)
        check_wide_table(plain, np.asarray(b.column("index")).tolist())
        tensors = batch_to_torch(plain)
        for name in ("image", "vec"):  # rows a multiple of 8 bytes: back to back in the body
            view: Any = b.column(name)
            buffers = view.buffers()
            views = np.frombuffer(buffers[1], dtype=np.int32).reshape(-1, 4)[view.offset:]
            first_row = buffers[2 + int(views[0, 2])].address + int(views[0, 3])
            assert tensors[name].data_ptr() == first_row  # the received body itself: no copy
        # 16,387-byte rows: runs padded apart, copied once (content checked above)
        odd: Any = b.column("odd")
        assert tensors["odd"].data_ptr() != odd.buffers()[2].address or len(odd.buffers()) == 3


def test_a_view_reader_with_stored_order_gets_plain_columns(wide_server: RunningServer) -> None:
    batches = _raw_read(wide_server.location, views=True, shuffle=False)
    assert batches and all(not _viewed(b) for b in batches)
    assert [i for b in batches for i in np.asarray(b.column("index")).tolist()] == list(range(WIDE_ROWS))
