"""`flightfeed serve` as a real process: worker processes behind one endpoint, graceful SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import pyarrow.flight as flight

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from tests.support.datasets import SMALL_ROWS, write_dataset
from tests.support.processes import start_serve


def test_workers_serve_streams_behind_one_coordinator(small_dir: Path) -> None:
    proc, location = start_serve(f"small={small_dir}", "--workers", "2")
    try:
        client = flight.FlightClient(location)
        cmd = ReadCommand(version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=16, streams=4, num_workers=1)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        locations = [ep.locations[0].uri.decode() for ep in info.endpoints]
        assert len(set(locations)) == 2 and location in locations  # the coordinator and its worker
        ds = FlightDataset(
            location,
            "small",
            batch_size=16,
            seed=1,
            options=ReadOptions(streams=4, report_interval=None),
        )
        rows = [i for b in ds for i in b["index"].tolist()]
        assert sorted(rows) == list(range(SMALL_ROWS))
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_sigterm_lets_in_flight_streams_finish(tmp_path: Path) -> None:
    rows = write_dataset(tmp_path / "big", [[4000] * 5])
    proc, location = start_serve(f"big={tmp_path / 'big'}")
    ds = FlightDataset(
        location,
        "big",
        batch_size=100,
        shuffle=False,
        options=ReadOptions(streams=2, prefetch=1, report_interval=None),
    )
    it = iter(ds)
    got = next(it)["index"].tolist()
    proc.send_signal(signal.SIGTERM)
    got += [i for b in it for i in b["index"].tolist()]
    assert got == list(range(rows))
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None and "shutting down" in proc.stderr.read()
