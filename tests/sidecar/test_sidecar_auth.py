"""The sidecar of a token-protected server wants the token too (docs/operations.md, security and limits): /metrics,
/stats and / answer 401 without ``Authorization: Bearer``; /healthz and /readyz stay open; the
dashboard asks for the token once and keeps it in the page."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from flightfeed.client._connect.report import Reporter
from flightfeed.server.sidecar import LocalSource, SidecarHandle, start_sidecar
from flightfeed.server.testing import RunningServer, running_server
from tests.sidecar.test_sidecar_dashboard import _chromium, _parse

TOKEN = "s3cret-token"
Counted = tuple[int, int]


@pytest.fixture
def protected(dataset_dir: Path) -> Iterator[tuple[RunningServer, SidecarHandle]]:
    with running_server({"demo": str(dataset_dir)}, auth_token=TOKEN) as srv:
        handle = start_sidecar(LocalSource(srv.metrics, srv.catalog, srv.location, token=TOKEN), "127.0.0.1", 0,
                               token=TOKEN)
        try:
            yield srv, handle
        finally:
            handle.stop()


def test_sidecar_wants_the_token_except_on_probes(protected: tuple[RunningServer, SidecarHandle]) -> None:
    _, handle = protected
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=handle.url) as http:
        for path in ("/metrics", "/stats", "/"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                refused = http.get(path, headers=headers)
                assert refused.status_code == 401, (path, headers)
                assert refused.headers["www-authenticate"].startswith("Bearer")
            assert http.get(path, headers=bearer).status_code == 200
        assert "flightfeed_rows_sent" not in http.get("/metrics").text
        assert "demo" not in http.get("/stats").text  # no dataset names or URIs without the token
        page = http.get("/")
        assert 'id="auth"' in page.text and "dataset_dir" not in page.text  # the static page, no figures
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").json() == {"status": "ready"}  # its probe sends the token
        assert http.get("/stats", headers=bearer).json()["datasets"][0]["name"] == "demo"


def test_serve_binds_the_sidecar_to_loopback_and_protects_it(dataset_dir: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"demo={dataset_dir}", "--port", "0",
           "--sidecar-port", "0", "--auth-token-file", str(token_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = next(line.split()[1] for line in proc.stdout if line.startswith("sidecar: "))
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "/stats").status_code == 401
        assert httpx.get(url + "/stats", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert httpx.get(url + "/readyz").status_code == 200
    finally:
        proc.kill()
        proc.wait(timeout=60)


@pytest.mark.browser
def test_dashboard_asks_for_the_token_and_keeps_it(
    chromium: str,
    protected: tuple[RunningServer, SidecarHandle],
    stream_all: Callable[..., Counted],
    tmp_path: Path,
) -> None:
    srv, handle = protected
    assert stream_all(srv.location, token=TOKEN)[0] > 0
    reporter = Reporter(srv.location, lambda: {"stall_ratio": 0.1}, static={"dataset": "demo"},
                        client_id="trainer-7", token=TOKEN, start=False)
    try:
        assert reporter.report_now()
    finally:
        reporter.close()

    locked = _chromium(chromium, tmp_path / "profile-locked", handle.url + "/", "--dump-dom")
    assert locked.returncode == 0, locked.stderr[-2000:]
    page = _parse(locked.stdout)
    assert page.by_id["status"]["text"] == "token needed"
    assert page.by_id["auth"]["class"] == "shown"  # the form asking for the token
    assert "trainer-7" not in page.by_id["clients"]["text"]

    # the token given once (in the URL fragment, never sent to the server) is used by every poll
    opened = _chromium(chromium, tmp_path / "profile-open", handle.url + "/#token=" + TOKEN, "--dump-dom")
    assert opened.returncode == 0, opened.stderr[-2000:]
    page = _parse(opened.stdout)
    assert page.by_id["status"]["text"].startswith("live")
    assert page.by_id["auth"].get("class", "") == ""
    assert int(page.by_id["clients-active"]["data-value"]) == 1
    assert "trainer-7" in page.by_id["clients"]["text"]
    assert TOKEN not in opened.stdout  # dropped from the address bar; kept in a variable only


def test_standalone_sidecar_process_with_and_without_the_token(dataset_dir: Path, tmp_path: Path) -> None:
    from tests.sidecar.test_sidecar_remote import _process

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with running_server({"demo": str(dataset_dir)}, auth_token=TOKEN) as srv:
        base = ["-m", "flightfeed.server.sidecar.cli", "--flight", srv.location, "--port", "0"]
        with _process([*base, "--auth-token-file", str(token_file)], tmp_path / "with.log") as (_, banner):
            url = banner.rsplit(" at ", 1)[1]
            assert httpx.get(url + "/readyz").status_code == 200
            assert httpx.get(url + "/metrics").status_code == 401  # its own HTTP side wants the token too
            ok = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200 and "flightfeed_sidecar_flight_up 1" in ok.text
        with _process(base, tmp_path / "without.log") as (_, banner):
            url = banner.rsplit(" at ", 1)[1]
            ready = httpx.get(url + "/readyz")
            assert ready.status_code == 503
            assert "wants a bearer token and the sidecar sent no token" in ready.json()["reason"]
