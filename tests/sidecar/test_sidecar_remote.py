"""The standalone sidecar (RemoteSource): figures read through the Flight ``stats`` action, in
this process and as separate processes (``flightfeed sidecar --flight ...``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.sidecar import LocalSource, RemoteSource, SidecarHandle, StatsSource
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import RunningServer, running_server

Counted = tuple[int, int]
TOTAL_ROWS = 3 * 600  # conftest.dataset_dir

# a flightfeed server in its own process: prints its location, serves until stdin closes
_SERVER_SCRIPT = """
import sys
from flightfeed.server.testing import running_server
with running_server({"demo": sys.argv[1]}) as srv:
    print(srv.location, flush=True)
    sys.stdin.read()
"""


def _value(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and (labels is None or s.labels == labels):
                return float(s.value)
    raise AssertionError(f"{name} {labels} not in the exposition")


def test_remote_source_relays_the_servers_figures(
    server: RunningServer,
    stream_all: Callable[..., Counted],
    sidecar: Callable[[StatsSource], SidecarHandle],
) -> None:
    rows, nbytes = stream_all(server.location)
    handle = sidecar(RemoteSource(server.location))
    with httpx.Client(base_url=handle.url) as http:
        assert http.get("/readyz").status_code == 200
        stats = http.get("/stats").json()
        text = http.get("/metrics").text
        assert stats["totals"]["rows"] == rows == TOTAL_ROWS
        assert stats["totals"]["bytes"] == nbytes
        assert stats["sidecar"] == {"mode": "remote", "flight": server.location, "flight_up": True}
        assert "prometheus_text" not in stats
        assert _value(text, "flightfeed_rows_sent_total", {"dataset": "demo"}) == rows
        assert _value(text, "flightfeed_bytes_sent_total", {"dataset": "demo"}) == nbytes
        assert _value(text, "flightfeed_sidecar_flight_up") == 1

        server.stop()
        assert http.get("/readyz").status_code == 503
        down = http.get("/stats")
        assert down.status_code == 503
        assert server.location in down.json()["error"]
        assert _value(http.get("/metrics").text, "flightfeed_sidecar_flight_up") == 0
        assert http.get("/healthz").status_code == 200


def test_remote_source_refuses_a_server_that_is_not_flightfeed(
    echo_server: Callable[[bytes], str], sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    location = echo_server(b"<html>not json</html>")
    handle = sidecar(RemoteSource(location))
    ready = httpx.get(handle.url + "/readyz")  # it answers health, but serves no datasets
    assert ready.status_code == 503 and "did not answer list_flights" in ready.json()["reason"]
    response = httpx.get(handle.url + "/stats")
    assert response.status_code == 503  # and its stats are not flightfeed's
    assert "not JSON" in response.json()["error"]


def test_remote_source_passes_the_bearer_token(
    dataset_dir: Path,
    stream_all: Callable[..., Counted],
    sidecar: Callable[[StatsSource], SidecarHandle],
) -> None:
    with running_server({"demo": str(dataset_dir)}, auth_token="s3cret") as srv:
        stream_all(srv.location, token="s3cret")
        anonymous = sidecar(RemoteSource(srv.location))
        ready = httpx.get(anonymous.url + "/readyz")
        assert ready.status_code == 503
        # the auth problem is named (it used to say "does not answer a 'health' action")
        assert "wants a bearer token and the sidecar sent no token" in ready.json()["reason"]
        assert "--auth-token-file" in httpx.get(anonymous.url + "/stats").json()["error"]
        wrong = sidecar(RemoteSource(srv.location, token="guess"))
        assert "sent a token it refused" in httpx.get(wrong.url + "/readyz").json()["reason"]
        with_token = sidecar(RemoteSource(srv.location, token="s3cret"))
        assert httpx.get(with_token.url + "/readyz").status_code == 200
        assert httpx.get(with_token.url + "/stats").json()["totals"]["rows"] == TOTAL_ROWS


@contextmanager
def _process(args: list[str], log: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process and the first line it prints; killed at exit if still running."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        if not line:
            proc.kill()
            proc.wait()
            pytest.fail(f"{args} printed nothing; stderr:\n{log.read_text()}")
        yield proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_standalone_sidecar_process_against_a_separate_server_process(
    dataset_dir: Path, stream_all: Callable[..., Counted], tmp_path: Path
) -> None:
    server_cmd = ["-c", _SERVER_SCRIPT, str(dataset_dir)]
    with _process(server_cmd, tmp_path / "server.log") as (server_proc, location):
        rows, nbytes = stream_all(location)
        cli = ["-m", "flightfeed.server.sidecar.cli", "--flight", location, "--port", "0"]
        with _process(cli, tmp_path / "sidecar.log") as (sidecar_proc, banner):
            url = banner.rsplit(" at ", 1)[1]
            assert url.startswith("http://127.0.0.1:")
            with httpx.Client(base_url=url) as http:
                assert http.get("/readyz").status_code == 200
                stats = http.get("/stats").json()
                assert (stats["totals"]["rows"], stats["totals"]["bytes"]) == (rows, nbytes)
                text = http.get("/metrics").text
                assert _value(text, "flightfeed_rows_sent_total", {"dataset": "demo"}) == rows

                assert server_proc.stdin is not None
                server_proc.stdin.close()  # the server process exits
                server_proc.wait(timeout=60)
                assert http.get("/readyz").status_code == 503
                assert http.get("/healthz").status_code == 200
            sidecar_proc.send_signal(signal.SIGTERM)
            assert sidecar_proc.wait(timeout=60) == 0


def test_sidecar_cli_rejects_a_location_that_is_not_flight() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flightfeed.server.sidecar.cli", "--flight", "http://x:1", "--port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2
    assert "grpc://HOST:PORT" in done.stderr
    assert json.dumps(done.stdout) == '""'


def _self_signed() -> tuple[bytes, bytes]:
    """A self-signed certificate for 127.0.0.1 (PEM cert, PEM key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_sidecars_of_a_tls_server(dataset_dir: Path, sidecar: Callable[[StatsSource], SidecarHandle]) -> None:
    pytest.importorskip("cryptography", reason="generating a test certificate needs `cryptography`")
    cert, key = _self_signed()
    catalog = open_catalog({"demo": str(dataset_dir)})
    srv = RunningServer(FlightFeedServer(catalog, "grpc+tls://127.0.0.1:0", tls_certificates=[(cert, key)]))
    try:
        assert srv.location.startswith("grpc+tls://")
        local = sidecar(LocalSource(srv.metrics, srv.catalog, srv.location))  # trusts its own server
        assert httpx.get(local.url + "/readyz").status_code == 200
        untrusted = sidecar(RemoteSource(srv.location))
        assert httpx.get(untrusted.url + "/readyz").status_code == 503
        trusted = sidecar(RemoteSource(srv.location, tls_root_certs=cert))
        assert httpx.get(trusted.url + "/readyz").status_code == 200
        assert httpx.get(trusted.url + "/stats").json()["datasets"][0]["name"] == "demo"
    finally:
        srv.stop()
        catalog.close()
