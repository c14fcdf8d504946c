"""The sidecar with tenants: a tenant's token gets /stats cut to its own datasets and row and 403
on /metrics; the operator's token sees every tenant's row (docs/security.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.flight as flight
import pytest

from flightfeed.server.sidecar import LocalSource, start_sidecar
from tests.support.datasets import SMALL_ROWS
from tests.tenants.support import OPERATOR_TOKEN, client, tenant_server


def test_the_sidecar_shows_a_tenant_only_its_own(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, registry, _):
        c, opts = client(srv.location, "vision-token")
        info = c.get_flight_info(flight.FlightDescriptor.for_path("imagenet-val"), options=opts)
        assert c.do_get(info.endpoints[0].ticket, options=opts).read_all().num_rows == SMALL_ROWS
        with pytest.raises(flight.FlightUnauthorizedError):
            c.get_flight_info(flight.FlightDescriptor.for_path("private-x"), options=opts)
        source = LocalSource(srv.metrics, srv.catalog, srv.location, token=OPERATOR_TOKEN)
        handle = start_sidecar(source, "127.0.0.1", 0, token=OPERATOR_TOKEN, tenants=registry)
        try:
            with httpx.Client(base_url=handle.url) as http:
                vision = {"Authorization": "Bearer vision-token"}
                stats = http.get("/stats", headers=vision)
                assert stats.status_code == 200
                body = stats.json()
                assert [d["name"] for d in body["datasets"]] == ["imagenet-train", "imagenet-val"]
                assert set(body["tenants"]) == {"vision"} and body["tenants"]["vision"]["rows"] == SMALL_ROWS
                assert body["tenants"]["vision"]["refusals"] == 1
                for hidden in ("librispeech", "private-x", "speech", '"clients"', "prometheus_text", str(small_dir)):
                    assert hidden not in stats.text
                refused = http.get("/metrics", headers=vision)
                assert refused.status_code == 403 and "librispeech" not in refused.text
                assert http.get("/stats", headers={"Authorization": "Bearer nobody"}).status_code == 401
                operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
                full = http.get("/stats", headers=operator).json()
                assert {"vision", "speech"} <= set(full["tenants"])
                metrics = http.get("/metrics", headers=operator).text
                assert 'flightfeed_tenant_refusals_total{tenant="vision"} 1.0' in metrics
                assert 'flightfeed_tenant_share{tenant="vision"} 1.0' in metrics
        finally:
            handle.stop()
            source.close()


def test_the_standalone_sidecar_reads_the_tenants_file_too(small_dir: Path, tmp_path: Path) -> None:
    operator = tmp_path / "operator"
    operator.write_text(OPERATOR_TOKEN + "\n")
    with tenant_server(small_dir, tmp_path) as (srv, _, tenants):
        cmd = [sys.executable, "-m", "flightfeed.server", "sidecar", "--flight", srv.location, "--port", "0",
               "--auth-token-file", str(operator), "--tenants", str(tenants)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            url = next(line.split()[-1] for line in proc.stdout if line.startswith("flightfeed sidecar for"))
            body = httpx.get(url + "/stats", headers={"Authorization": "Bearer speech-token"}, timeout=30).json()
            assert body["tenant"] == "speech" and [d["name"] for d in body["datasets"]] == ["librispeech"]
            assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer speech-token"}).status_code == 403
            full = httpx.get(url + "/stats", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=30)
            assert len(full.json()["datasets"]) == 4
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_the_standalone_sidecar_wants_the_operator_token_with_tenants(tmp_path: Path) -> None:
    tenants = tmp_path / "t.toml"
    tenants.write_text('[tenant.a]\ntoken_sha256 = "' + "0" * 64 + '"\ndatasets = ["*"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "flightfeed.server", "sidecar", "--flight", "grpc://127.0.0.1:1", "--port", "0",
         "--tenants", str(tenants)], capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2 and "--tenants needs --auth-token-file" in out.stderr and "Traceback" not in out.stderr
