"""Isolation: a tenant reads its own datasets only, and no call (listing, info, schema, do_get,
actions) tells it the names of the others; refusals are PermissionDenied, audited without the
token (docs/security.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, PermissionDenied, ReadOptions
from flightfeed.client._connect.boundary import translate
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import Unauthenticated
from flightfeed.wire.feed_pb2 import ClientReport
from flightfeed.wire.messages import decode_ticket
from tests.support.datasets import SMALL_ROWS
from tests.tenants.support import DATASETS, OPERATOR_TOKEN, client, tenant_server

OTHERS = ("imagenet", "librispeech", "private-x")  # what vision must never see beyond its own


def _name(info: flight.FlightInfo) -> str:
    return bytes((info.descriptor.path or [b""])[0]).decode()


def _refusal(exc: BaseException) -> str:
    out = translate(exc)
    assert isinstance(out, PermissionDenied), repr(exc)
    return str(out)


def test_list_flights_lists_only_the_tenants_datasets(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        c, opts = client(srv.location, "vision-token")
        assert sorted(_name(i) for i in c.list_flights(options=opts)) == [
            "imagenet-train", "imagenet-val",
        ]
        c, opts = client(srv.location, OPERATOR_TOKEN)
        assert sorted(_name(i) for i in c.list_flights(options=opts)) == sorted(DATASETS)


@pytest.mark.parametrize("name", ["librispeech", "private-x", "ghost-set", "imagenet-missing"])
def test_every_call_refuses_the_same_way_whether_or_not_the_dataset_exists(
    small_dir: Path, tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        c, opts = client(srv.location, "vision-token")
        texts = []
        descriptor = flight.FlightDescriptor.for_path(name)
        for call in (c.get_flight_info, c.get_schema):
            # get_schema's refusal reaches pyarrow's client as OSError, with the same tagged text
            with pytest.raises((flight.FlightUnauthorizedError, pa.ArrowException, OSError)) as info:
                call(descriptor, options=opts)
            texts.append(_refusal(info.value))
        # a ticket the operator was given, replayed with vision's token: refused at do_get too
        op, op_opts = client(srv.location, OPERATOR_TOKEN)
        if name in DATASETS:
            ticket = op.get_flight_info(descriptor, options=op_opts).endpoints[0].ticket
            assert decode_ticket(ticket.ticket).read.dataset == name
            with pytest.raises(flight.FlightUnauthorizedError) as info:
                c.do_get(ticket, options=opts).read_all()
            texts.append(_refusal(info.value))
        for text in texts:
            assert text == texts[0]
            assert f"dataset {name!r}" in text
            for other in DATASETS:  # names only what it asked for
                assert other == name or other not in text
        assert "vision-token" not in caplog.text
        audit = [r.getMessage() for r in caplog.records if r.name == "flightfeed.audit"]
        assert len(audit) == len(texts) and all("tenant=vision" in a and repr(name) in a for a in audit)
        assert all("peer=ipv4:127.0.0.1" in a for a in audit)


def test_unknown_token_is_unauthenticated(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        c, opts = client(srv.location, "nobody-token")
        with pytest.raises(flight.FlightUnauthenticatedError) as info:
            list(c.list_flights(options=opts))
        assert isinstance(translate(info.value), Unauthenticated)


def test_the_torch_client_gets_its_rows_and_a_permission_denied(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        own = FlightDataset(srv.location, "imagenet-val", batch_size=64, connect=ConnectOptions(token="vision-token"))
        assert sum(len(b["index"]) for b in own) == SMALL_ROWS
        other = FlightDataset(srv.location, "librispeech", batch_size=64, connect=ConnectOptions(token="vision-token"))
        with pytest.raises(PermissionDenied, match="tenant 'vision' may not read dataset 'librispeech'"):
            next(iter(other))


def test_actions_show_a_tenant_only_its_own(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        c, opts = client(srv.location, "vision-token")
        list(c.do_get(c.get_flight_info(flight.FlightDescriptor.for_path("imagenet-val"), options=opts)
                      .endpoints[0].ticket, options=opts).read_all().to_batches())
        (body,) = c.do_action(flight.Action("stats", b""), options=opts)
        stats = json.loads(body.body.to_pybytes())
        text = json.dumps(stats)
        assert stats["tenant"] == "vision" and [d["name"] for d in stats["datasets"]] == ["imagenet-train",
                                                                                           "imagenet-val"]
        assert "librispeech" not in text and "private-x" not in text and "speech" not in text
        assert stats["tenants"]["vision"]["rows"] == SMALL_ROWS
        with pytest.raises(flight.FlightUnauthorizedError) as info:
            list(c.do_action(flight.Action("shard", b'{"dataset": "private-x", "uri": "x"}'), options=opts))
        assert "between data nodes" in _refusal(info.value)
        (health,) = c.do_action(flight.Action("health", b'{"id": "x"}'), options=opts)
        assert health.body.to_pybytes() == b"ok"  # the plain answer, not the node's detail
        op, op_opts = client(srv.location, OPERATOR_TOKEN)
        (body,) = op.do_action(flight.Action("stats", b""), options=op_opts)
        full = json.loads(body.body.to_pybytes())
        assert full["tenants"]["vision"]["rows"] == SMALL_ROWS and full["tenants"]["speech"]["refusals"] == 0
        assert full["tenants"]["vision"]["share"] == 1.0
        assert 'flightfeed_tenant_rows_total{tenant="vision"}' in full["prometheus_text"]


def test_max_streams_is_enforced(big_dir: Path, tmp_path: Path) -> None:
    text = '[tenant.a]\ntoken = "a-token"\ndatasets = ["*"]\nmax_streams = 2\n'
    with tenant_server(big_dir, tmp_path, text, message_bytes=64 << 10) as (srv, _, _):
        ds = FlightDataset(srv.location, "imagenet-val", batch_size=64, connect=ConnectOptions(token="a-token"),
                           options=ReadOptions(streams=3))
        with pytest.raises(PermissionDenied, match=r"tenant 'a' may open at most 2 streams \(max_streams\)"):
            next(iter(ds))
        c, opts = client(srv.location, "a-token")
        info = c.get_flight_info(flight.FlightDescriptor.for_path("imagenet-val"), options=opts)
        held = [c.do_get(info.endpoints[0].ticket, options=opts) for _ in range(2)]
        for r in held:
            r.read_chunk()
        with pytest.raises(flight.FlightUnauthorizedError) as err:
            c.do_get(info.endpoints[0].ticket, options=opts).read_all()
        assert "already has 2 streams open" in _refusal(err.value)
        for r in held:
            r.read_all()
        assert c.do_get(info.endpoints[0].ticket, options=opts).read_all().num_rows > 0  # freed again


def test_a_single_auth_token_still_reads_every_dataset(small_dir: Path) -> None:
    with running_server({"a": str(small_dir), "b": str(small_dir)}, auth_token="the-one-token") as srv:
        c, opts = client(srv.location, "the-one-token")
        assert len(list(c.list_flights(options=opts))) == 2
        for name in ("a", "b"):
            info = c.get_flight_info(flight.FlightDescriptor.for_path(name), options=opts)
            assert sum(c.do_get(e.ticket, options=opts).read_all().num_rows for e in info.endpoints) == SMALL_ROWS
        with pytest.raises(flight.FlightServerError, match="unknown dataset 'c'; served datasets: a, b"):
            c.get_flight_info(flight.FlightDescriptor.for_path("c"), options=opts)
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client(srv.location, "wrong")[0].list_flights(options=client(srv.location, "wrong")[1]))


_ = logging


def test_max_bytes_per_s_holds_the_tenants_streams_back(big_dir: Path, tmp_path: Path) -> None:
    text = '[tenant.a]\ntoken = "a-token"\ndatasets = ["*"]\nmax_bytes_per_s = "1MiB"\n'
    with tenant_server(big_dir, tmp_path, text, message_bytes=256 << 10) as (srv, _, _):
        waits: list[float] = []
        srv.server.access.sleep = waits.append  # the waits asked for (no real sleeping, no timing)
        srv.server.access.clock = lambda: 0.0  # a clock that stands still: the bucket never refills
        c, opts = client(srv.location, "a-token")
        info = c.get_flight_info(flight.FlightDescriptor.for_path("imagenet-val"), options=opts)
        table = c.do_get(info.endpoints[0].ticket, options=opts).read_all()
        sent = table.nbytes
        # 1 MiB/s with 1 s of burst, never refilled: the last wait is what was sent beyond the burst
        assert sent > 4 << 20
        assert waits[-1] >= (sent - (1 << 20)) / (1 << 20) * 0.99
        assert waits[-1] <= (sent - (1 << 20)) / (1 << 20) * 1.05


def test_a_report_about_another_dataset_lists_only_the_tenants_own(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, _, _):
        c, opts = client(srv.location, "vision-token")
        texts = []
        for name in ("private-x", "no-such-set"):
            body = ClientReport(dataset=name, client_id="c1").SerializeToString()
            with pytest.raises(flight.FlightServerError) as info:
                list(c.do_action(flight.Action("report", body), options=opts))
            texts.append(str(translate(info.value)).replace(name, "NAME"))
        assert texts[0] == texts[1] and "served datasets: imagenet-train, imagenet-val" in texts[0]
        ok = ClientReport(dataset="imagenet-val", client_id="c1").SerializeToString()
        assert [r.body.to_pybytes() for r in c.do_action(flight.Action("report", ok), options=opts)] == [b"ok"]
