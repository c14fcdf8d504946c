"""``/readyz`` means the node serves (docs/cluster.md): a node wedged in its request path is unready.

The wedge is a real one, seen once: the cluster membership's lock held (the start-up deadlock
held it forever), which every ``get_flight_info`` takes to spread its endpoints. The plain
``health`` action does not take it, so it kept answering ``ok`` and the sidecar said ready.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow.flight as flight

from flightfeed.server.cluster import Membership
from flightfeed.server.sidecar import LocalSource, RemoteSource, SidecarHandle, StatsSource
from flightfeed.server.testing import RunningServer, running_server

PROBE_S = 0.5  # the probes' deadline here (2 s by default)


def _with_membership(server: RunningServer) -> Membership:
    """The server's cluster with a membership of no peers (never started): its lock is the one
    a ``get_flight_info`` takes."""
    c = server.server.cluster
    c.membership = Membership(c.me, c.datasets)
    return c.membership


def _plain_health(location: str) -> bytes:
    client = flight.FlightClient(location)
    try:
        return b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("health", b"")))
    finally:
        client.close()


def test_readyz_is_unready_while_the_request_path_is_wedged(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    membership = _with_membership(server)
    local = LocalSource(server.metrics, server.catalog, server.location, timeout_s=PROBE_S)
    remote = RemoteSource(server.location, timeout_s=PROBE_S)  # `flightfeed sidecar --timeout 0.5`
    urls = [sidecar(local).url, sidecar(remote).url]
    try:
        for url in urls:
            assert httpx.get(url + "/readyz").json() == {"status": "ready"}
        with membership._lock:  # wedged: every get_flight_info now waits for this lock
            assert _plain_health(server.location) == b"ok"  # what /readyz used to ask
            for url in urls:
                answer = httpx.get(url + "/readyz", timeout=30)
                assert answer.status_code == 503
                reason = answer.json()["reason"]
                assert "get_flight_info" in reason and server.location in reason and "wedged" in reason
            assert httpx.get(urls[0] + "/healthz").status_code == 200  # the process is alive
        for url in urls:  # the lock released: the waiting calls finish, the node serves again
            assert httpx.get(url + "/readyz", timeout=30).json() == {"status": "ready"}
    finally:
        local.close()
        remote.close()


def test_readyz_is_unready_while_draining(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    source = LocalSource(server.metrics, server.catalog, server.location, timeout_s=PROBE_S)
    url = sidecar(source).url
    try:
        assert httpx.get(url + "/readyz").status_code == 200
        server.server.cluster.drain()
        answer = httpx.get(url + "/readyz", timeout=30)
        assert answer.status_code == 503
        assert "did not answer health" in answer.json()["reason"] and "draining" in answer.json()["reason"]
    finally:
        source.close()


def test_readyz_sends_the_token_on_every_step(
    dataset_dir: Path, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    with running_server({"demo": str(dataset_dir)}, auth_token="s3cret") as srv:
        good = RemoteSource(srv.location, timeout_s=5.0, token="s3cret")
        bad = RemoteSource(srv.location, timeout_s=5.0, token="wrong")
        try:
            assert httpx.get(sidecar(good).url + "/readyz").status_code == 200
            refused = httpx.get(sidecar(bad).url + "/readyz")
            assert refused.status_code == 503 and "--auth-token-file" in refused.json()["reason"]
        finally:
            good.close()
            bad.close()
