"""The standalone sidecar (``flightfeed sidecar``, the pod's second container) next to
``flightfeed serve --workers 2 --no-sidecar``: its ``/stats`` and ``/metrics`` count the rows every
serving process sent, not only the coordinator's share (real processes on 127.0.0.1, with a token)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pyarrow.flight as flight

from flightfeed.server.sidecar import RemoteSource
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle
from tests.sidecar.conftest import ROWS_PER_SHARD, SHARDS
from tests.sidecar.test_sidecar_remote import _process, _value
from tests.support.processes import start_serve

TOTAL = SHARDS * ROWS_PER_SHARD
TOKEN = "standalone-workers-token"


def _read_epoch(location: str, headers: Any) -> dict[str, int]:
    """One shuffled epoch of ``demo`` in 4 streams, each read where its endpoint says; rows per process."""
    cmd = ReadCommand(
        version=WIRE_VERSION, dataset="demo", world_size=1, batch_rows=50, streams=4, num_workers=1, seed=3,
        shuffle=Shuffle(enabled=True),
    )
    options = flight.FlightCallOptions(headers=headers)
    entry = flight.FlightClient(location)
    clients: dict[str, flight.FlightClient] = {}
    served: dict[str, int] = {}
    try:
        info = entry.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()), options)
        for endpoint in info.endpoints:
            where = endpoint.locations[0].uri.decode() if endpoint.locations else location
            client = clients.setdefault(where, flight.FlightClient(where))
            rows = sum(chunk.data.num_rows for chunk in client.do_get(endpoint.ticket, options) if chunk.data)
            served[where] = served.get(where, 0) + rows
    finally:
        for client in [entry, *clients.values()]:
            client.close()
    return served


def test_standalone_sidecar_counts_every_worker_process(dataset_dir: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    headers: Any = [(b"authorization", f"Bearer {TOKEN}".encode())]
    proc, location = start_serve(
        f"demo={dataset_dir}", "--workers", "2", "--decode-workers", "1", "--auth-token-file", str(token_file)
    )
    try:
        served = _read_epoch(location, headers)
        assert sum(served.values()) == TOTAL
        workers = [w for w in served if w != location]
        assert workers and served[workers[0]] > 0  # the epoch really went through a worker process
        cli = ["-m", "flightfeed.server.sidecar.cli", "--flight", location, "--port", "0",
               "--auth-token-file", str(token_file)]
        with _process(cli, tmp_path / "sidecar.log") as (sidecar_proc, banner):
            url = banner.rsplit(" at ", 1)[1]
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                assert http.get("/readyz").status_code == 200  # readiness: the coordinator's, as before
                stats = http.get("/stats").json()
                assert stats["totals"]["rows"] == TOTAL  # the coordinator alone: TOTAL - served[worker]
                (demo,) = [d for d in stats["datasets"] if d["name"] == "demo"]
                assert demo["rows_sent"] == TOTAL and demo["rows"] == TOTAL
                assert stats["worker_locations"] == workers  # what the coordinator supervises
                assert stats["workers"] == {"merged": workers, "not_answering": []}
                text = http.get("/metrics").text
                assert _value(text, "flightfeed_rows_sent_total", {"dataset": "demo"}) == TOTAL
                assert _value(text, "flightfeed_sidecar_workers_up") == 1
                assert _value(text, "flightfeed_sidecar_flight_up") == 1
            sidecar_proc.send_signal(signal.SIGTERM)
            assert sidecar_proc.wait(timeout=60) == 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_remote_source_dials_wildcard_workers_where_it_reaches_the_server(
    echo_server: Callable[[bytes], str],
) -> None:
    body = {"totals": {"rows": 1}, "worker_locations": ["grpc://0.0.0.0:4001", "grpc://10.1.2.3:4002", 7]}
    location = echo_server(json.dumps(body).encode())
    remote = RemoteSource(location.replace("127.0.0.1", "localhost"))
    try:
        assert remote.worker_locations() == []  # nothing before the first answer
        remote.stats()
        assert remote.worker_locations() == ["grpc://localhost:4001", "grpc://10.1.2.3:4002"]
    finally:
        remote.close()
