"""FlightDataset against real servers: exact content, order determinism, errors, truncation, retry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest
import torch

from flightfeed.client import (
    ConnectOptions,
    DatasetNotFound,
    FlightDataset,
    InvalidRequest,
    ReadOptions,
    StreamTruncated,
    Unauthenticated,
)
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import RunningServer, running_server
from tests.support.datasets import SMALL_ROWS, image_of


def epoch_indices(ds: FlightDataset) -> list[int]:
    return [i for b in ds for i in b["index"].tolist()]


def test_every_row_once_with_exact_content(server: RunningServer) -> None:
    ds = FlightDataset(server.location, "small", batch_size=32, seed=5, options=ReadOptions(streams=3))
    seen: list[int] = []
    for batch in ds:
        idx = batch["index"].numpy()
        assert batch["image"].shape == (len(idx), 4, 4, 3) and batch["image"].dtype == torch.uint8
        assert (batch["image"].reshape(len(idx), 48).numpy() == image_of(idx)).all()
        assert batch["x"].dtype == torch.float32 and torch.equal(batch["x"], torch.from_numpy(idx * 0.5).float())
        assert batch["label"].tolist() == (idx % 10).tolist()
        assert batch["name"] == [f"row-{i}" for i in idx]
        seen += idx.tolist()
    assert sorted(seen) == list(range(SMALL_ROWS))
    assert seen != sorted(seen)  # shuffled


def test_unshuffled_is_stored_order(server: RunningServer) -> None:
    ds = FlightDataset(server.location, "small", batch_size=50, shuffle=False, options=ReadOptions(streams=2))
    batches = list(ds)
    assert [len(b["index"]) for b in batches] == [50] * 8 + [22]
    assert epoch_indices(ds) == list(range(SMALL_ROWS))


def test_order_is_a_function_of_seed_and_epoch(server: RunningServer) -> None:
    def order(seed: int, epoch: int, streams: int) -> list[int]:
        ds = FlightDataset(server.location, "small", batch_size=16, seed=seed, options=ReadOptions(streams=streams))
        ds.set_epoch(epoch)
        return epoch_indices(ds)

    base = order(1, 0, 1)
    assert order(1, 0, 4) == base
    assert order(2, 0, 1) != base
    assert order(1, 1, 2) != base
    assert sorted(order(1, 1, 2)) == list(range(SMALL_ROWS))


def test_columns_projection(server: RunningServer) -> None:
    ds = FlightDataset(server.location, "small", columns=["index", "x"], batch_size=100)
    batch = next(iter(ds))
    assert set(batch) == {"index", "x"}


def test_client_errors_are_flightfeed_errors(server: RunningServer) -> None:
    with pytest.raises(DatasetNotFound, match=r"unknown dataset 'nope'; served datasets: small"):
        next(iter(FlightDataset(server.location, "nope")))
    with pytest.raises(InvalidRequest, match=r"unknown column\(s\) \['colour'\]"):
        next(iter(FlightDataset(server.location, "small", columns=["colour"])))


class TruncatingServer(FlightFeedServer):
    """Every stream ends one message early, cleanly (no error): only row counting can tell."""

    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        from flightfeed.server.request.streaming import ticket_batches
        from flightfeed.wire.messages import decode_ticket

        t = decode_ticket(ticket.ticket)
        ds = self.catalog.get(t.read.dataset)
        batches = list(ticket_batches(ds, t))[:-1]
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(ds.schema, iter(batches)))


class FlakyServer(FlightFeedServer):
    """The first do_get of each stream fails after its first message (a dying data server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed: set[int] = set()

    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        from flightfeed.server.request.streaming import ticket_batches
        from flightfeed.wire.messages import decode_ticket

        t = decode_ticket(ticket.ticket)
        ds = self.catalog.get(t.read.dataset)
        gen = ticket_batches(ds, t)
        if t.stream_index in self.failed:
            return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(ds.schema, gen))
        self.failed.add(int(t.stream_index))

        def dying() -> Any:
            yield next(gen)
            raise flight.FlightUnavailableError("data node went away")

        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(ds.schema, dying()))


def test_truncated_stream_is_detected(small_dir: Path) -> None:
    catalog = open_catalog({"small": str(small_dir)})
    server = TruncatingServer(catalog, "grpc://127.0.0.1:0")
    handle = RunningServer(server)
    try:
        ds = FlightDataset(
            server.location,
            "small",
            batch_size=16,
            connect=ConnectOptions(retries=1, retry_timeout=0.5),  # a count ends no outage before 5 s
            options=ReadOptions(streams=2, message_rows=32),
        )
        with pytest.raises(StreamTruncated, match=r"stream \d ended after \d+ of \d+ messages"):
            list(ds)
    finally:
        handle.stop()
        catalog.close()


def test_failed_stream_is_retried_without_loss_or_duplicates(small_dir: Path, server: RunningServer) -> None:
    reference = epoch_indices(FlightDataset(
        server.location,
        "small",
        batch_size=16,
        seed=9,
        options=ReadOptions(streams=3),
    ))
    catalog = open_catalog({"small": str(small_dir)})
    flaky = FlakyServer(catalog, "grpc://127.0.0.1:0")
    handle = RunningServer(flaky)
    try:
        ds = FlightDataset(
            flaky.location,
            "small",
            batch_size=16,
            seed=9,
            options=ReadOptions(streams=3, message_rows=32),
        )
        assert epoch_indices(ds) == reference
        assert flaky.failed == {0, 1, 2}
    finally:
        handle.stop()
        catalog.close()


def test_token_auth(small_dir: Path) -> None:
    with running_server({"small": str(small_dir)}, auth_token="s3cret") as srv:
        with pytest.raises(Unauthenticated, match=r"missing or wrong bearer token"):
            next(iter(FlightDataset(srv.location, "small", options=ReadOptions(report_interval=None))))
        with pytest.raises(Unauthenticated):
            next(iter(FlightDataset(
                srv.location,
                "small",
                connect=ConnectOptions(token="wrong"),
                options=ReadOptions(report_interval=None),
            )))
        ds = FlightDataset(srv.location, "small", batch_size=100, connect=ConnectOptions(token="s3cret"))
        assert sorted(epoch_indices(ds)) == list(range(SMALL_ROWS))


def test_bad_client_settings() -> None:
    from flightfeed.client import ConfigError

    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: FlightDataset("grpc://127.0.0.1:1", "x", batch_size=0), "batch_size is 0"),
        (lambda: ReadOptions(streams=0), "streams is 0"),
        (lambda: FlightDataset("grpc://127.0.0.1:1", "x", seed=-1), "seed is -1"),
        (lambda: ReadOptions(compression="gzip"), "compression is 'gzip'"),
    ]
    for make, message in cases:
        with pytest.raises(ConfigError, match=message):
            make()


def test_stall_figures(server: RunningServer) -> None:
    ds = FlightDataset(server.location, "small", batch_size=64)
    list(ds)
    figures = ds.stats()
    assert figures["rows"] == SMALL_ROWS and figures["batches"] == 7
    assert 0.0 <= figures["stall_ratio"] <= 1.0 and figures["wait_s"] <= figures["elapsed_s"]


def test_close_stops_an_iteration_in_progress(server: RunningServer) -> None:
    import threading

    ds = FlightDataset(
        server.location,
        "small",
        batch_size=8,
        # many one-batch messages per stream and a queue of one: the streams block rather than finish
        options=ReadOptions(streams=3, prefetch=1, message_rows=8, report_interval=None),
    )
    before = set(threading.enumerate())  # other tests' abandoned iterations may still be winding down
    it = iter(ds)
    next(it)  # streams are open and blocked on their full queues
    mine = [t for t in set(threading.enumerate()) - before if t.name.startswith("flightfeed-stream")]
    assert mine  # each stream has many one-batch messages and a queue of one: they are blocked, not done
    ds.close()
    assert not [t for t in mine if t.is_alive()]
    del it
