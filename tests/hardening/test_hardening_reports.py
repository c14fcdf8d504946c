"""The ``report`` action is bounded: id length, number of tracked clients (oldest evicted and
counted), and every field validated (docs/operations.md, caps per request)."""

from __future__ import annotations

from typing import Any

import pyarrow.flight as flight
import pytest

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.reports import ClientTable, validate_report
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.messages import ClientReport


def _report(**fields: Any) -> Any:
    base: dict[str, Any] = dict(client_id="trainer-0", dataset="small", rank=0, world_size=1, stall_ratio=0.1)
    base.update(fields)
    return ClientReport(**base)


def _send(server: RunningServer, report: Any) -> None:
    client = flight.FlightClient(server.location)
    try:
        list(client.do_action(flight.Action("report", report.SerializeToString())))
    finally:
        client.close()


def test_huge_client_id_is_refused(server: RunningServer) -> None:
    before = len(server.metrics.prometheus_text())
    with pytest.raises(flight.FlightError, match=r"(report body is \d+ bytes|client_id is \d+ characters)"):
        _send(server, _report(client_id="x" * 50_000_000))  # was accepted: /metrics grew to 180 MB
    with pytest.raises(flight.FlightServerError, match=r"report.client_id is 1000 characters long; at most 128"):
        _send(server, _report(client_id="y" * 1000))
    assert len(server.metrics.prometheus_text()) < before + 1000


BAD_FIELDS = [
    (dict(client_id=""), r"report.client_id is empty"),
    (dict(client_id="a\x00b"), r"report.client_id .* contains control characters"),
    (dict(dataset="other"), r"report.dataset 'other' is not served here; served datasets: small"),
    (dict(rank=3, world_size=2), r"report.rank is 3; allowed: 0..1"),
    (dict(world_size=1 << 30), r"report.world_size is 1073741824"),
    (dict(stall_ratio=float("nan")), r"report.stall_ratio is nan; it must be finite"),
    (dict(stall_ratio=1.5), r"report.stall_ratio is 1.5; allowed: 0..1"),
    (dict(rows_per_s=-1.0), r"report.rows_per_s is -1.0"),
    (dict(wait_s=float("inf")), r"report.wait_s is inf"),
    (dict(rows_total=1 << 63), r"report.rows_total is 9223372036854775808"),
    (dict(device="d" * 100), r"report.device is 100 characters long"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_FIELDS)
def test_every_report_field_is_validated(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validate_report(_report(**fields), ["small"])


def test_bad_reports_are_refused_by_the_server(server: RunningServer) -> None:
    with pytest.raises(flight.FlightServerError, match=r"\[flightfeed:InvalidRequest\] report.stall_ratio is nan"):
        _send(server, _report(client_id="nan-client", stall_ratio=float("nan")))
    assert "nan-client" not in server.metrics.clients()
    _send(server, _report(client_id="good-client"))
    assert server.metrics.clients()["good-client"]["stall_ratio"] == pytest.approx(0.1)


def test_ten_thousand_ids_are_capped_oldest_evicted_and_counted() -> None:
    metrics = ServerMetrics(max_clients=100)
    for i in range(10_000):
        metrics.client_report(validate_report(_report(client_id=f"c{i}"), ["small"]))
    clients = metrics.clients()
    assert len(clients) == 100
    assert set(clients) == {f"c{i}" for i in range(9_900, 10_000)}  # the most recent ones
    text = metrics.prometheus_text().decode()
    assert "flightfeed_clients_evicted_total 9900.0" in text
    assert text.count("flightfeed_client_stall_ratio{") == 100  # evicted clients' series are gone
    metrics.client_report(validate_report(_report(client_id="c9950", stall_ratio=0.5), ["small"]))
    assert len(metrics.clients()) == 100  # a known client is updated, nothing evicted
    assert "flightfeed_clients_evicted_total 9900.0" in metrics.prometheus_text().decode()


def test_client_table_forgets_silent_clients_in_order() -> None:
    table = ClientTable(max_clients=3, forget_s=10)
    for i, t in enumerate((0.0, 1.0, 2.0)):
        assert table.put({"client_id": f"c{i}", "dataset": "d"}, t) == []
    table.put({"client_id": "c0", "dataset": "d"}, 5.0)  # c0 reported again: now the newest
    dropped = table.put({"client_id": "c3", "dataset": "d"}, 6.0)
    assert [r["client_id"] for r in dropped] == ["c1"] and table.evicted == 1
    assert [r["client_id"] for r in table.forget(14.5)] == ["c2"]  # silent since t=2
    assert [r["client_id"] for r in table.rows()] == ["c0", "c3"]
