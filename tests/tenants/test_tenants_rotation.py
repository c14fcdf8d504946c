"""Rotation without a restart: a reload swaps the tenants; unchanged tenants' streams go on
untouched, a revoked token's streams end with PermissionDenied at their next message, a token
added beside the old one works at once, a bad file keeps the tenants in force (docs/security.md)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

from flightfeed.client._connect.boundary import translate
from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.guards.tenants.rewrite import load_tenants
from flightfeed.wire.errors import PermissionDenied
from tests.tenants.conftest import BIG_ROWS
from tests.tenants.support import SECRETS, client, tenant_server

ROTATED = """\
[tenant.vision]
token = "vision-token-2"
datasets = ["imagenet*"]

[tenant.speech]
token_sha256 = [{speech}]
datasets = ["librispeech", "ghost*"]
"""


def _hashes(registry: TenantRegistry, name: str) -> str:
    return ", ".join(f'"{c.stored()}"' for c in registry.table.tenants[name].credentials)


def _open(location: str, token: str, dataset: str) -> flight.FlightStreamReader:
    c, opts = client(location, token)
    (endpoint,) = c.get_flight_info(flight.FlightDescriptor.for_path(dataset), options=opts).endpoints
    return c.do_get(endpoint.ticket, options=opts)


def _rest(reader: flight.FlightStreamReader, seen: list[np.ndarray]) -> None:
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            return
        seen.append(_index(chunk))


def _index(chunk: flight.FlightStreamChunk) -> np.ndarray:
    assert chunk.data is not None
    return chunk.data.column("index").to_numpy()


def test_a_revoked_token_ends_its_stream_and_the_others_go_on(big_dir: Path, tmp_path: Path) -> None:
    with tenant_server(big_dir, tmp_path, message_bytes=64 << 10) as (srv, registry, path):
        vision = _open(srv.location, "vision-token", "imagenet-train")
        speech = _open(srv.location, "speech-token", "librispeech")
        got_v = [_index(vision.read_chunk())]
        got_s = [_index(speech.read_chunk())]
        path.write_text(ROTATED.format(speech=_hashes(registry, "speech")))  # vision's token replaced
        assert registry.reload()
        with pytest.raises(flight.FlightError) as info:  # mid-stream: the tag carries the class
            _rest(vision, got_v)
        err = translate(info.value)
        assert isinstance(err, PermissionDenied) and "tenant 'vision' may not read dataset 'imagenet-train'" in str(err)
        assert 0 < sum(map(len, got_v)) < BIG_ROWS  # cut off, not finished
        _rest(speech, got_s)  # the unchanged tenant: every row once, in order
        assert np.array_equal(np.concatenate(got_s), np.arange(BIG_ROWS))
        with pytest.raises(flight.FlightUnauthenticatedError):
            _open(srv.location, "vision-token", "imagenet-train")
        assert _open(srv.location, "vision-token-2", "imagenet-val").read_all().num_rows == BIG_ROWS
        assert srv.server.access.figures.snapshot()["vision"]["refusals"] == 1


def test_a_change_of_the_file_ends_a_revoked_stream_at_its_next_message_without_the_watcher(
    big_dir: Path, tmp_path: Path
) -> None:
    """No reload() call and no watcher thread: the stream itself looks at the file before each
    message, so the revocation does not wait for the watcher's next look."""
    with tenant_server(big_dir, tmp_path, message_bytes=64 << 10) as (srv, registry, path):
        assert registry._thread is None  # the test server starts no watcher
        vision = _open(srv.location, "vision-token", "imagenet-train")
        got_v = [_index(vision.read_chunk())]
        reloads = registry.reloads
        path.write_text(ROTATED.format(speech=_hashes(registry, "speech")))  # vision's token replaced
        with pytest.raises(flight.FlightError) as info:
            _rest(vision, got_v)
        assert isinstance(translate(info.value), PermissionDenied)
        assert 0 < sum(map(len, got_v)) < BIG_ROWS
        assert registry.reloads == reloads + 1  # read once, whatever streams asked
        assert not registry.fresh()  # unchanged since: no second read


def test_a_token_added_beside_the_old_one_works_at_once_and_the_old_streams_go_on(
    big_dir: Path, tmp_path: Path
) -> None:
    with tenant_server(big_dir, tmp_path, message_bytes=64 << 10) as (srv, registry, path):
        old = _open(srv.location, "vision-token", "imagenet-train")
        got = [_index(old.read_chunk())]
        text = path.read_text().replace('datasets = ["imagenet*"]', 'datasets = ["imagenet*"]\ntoken = "vision-new"', 1)
        path.write_text(text)
        assert registry.reload()
        assert "vision-new" not in path.read_text()  # hashed in place on the reload
        assert _open(srv.location, "vision-new", "imagenet-val").read_all().num_rows == BIG_ROWS
        _rest(old, got)
        assert np.array_equal(np.concatenate(got), np.arange(BIG_ROWS))


def test_the_same_token_hashed_again_with_another_salt_keeps_its_streams(big_dir: Path, tmp_path: Path) -> None:
    with tenant_server(big_dir, tmp_path, message_bytes=64 << 10) as (srv, registry, path):
        stream = _open(srv.location, "vision-token", "imagenet-train")
        got = [_index(stream.read_chunk())]
        # the file written anew with vision's token as plain text: hashed again with a new salt, the
        # same token (one write: a stream that reloads between two writes would see vision removed)
        path.write_text(ROTATED.replace("vision-token-2", "vision-token").format(speech=_hashes(registry, "speech")))
        registry.reload()  # (a stream's own look before its next message may have reloaded it already)
        assert registry.table.identify(b"vision-token") is not None
        _rest(stream, got)
        assert np.array_equal(np.concatenate(got), np.arange(BIG_ROWS))


def test_a_bad_new_file_keeps_the_tenants_in_force(
    small_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, registry, path):
        before = registry.table
        path.write_text("[tenant.vision]\ntoken = 'x'\n")  # no datasets
        with caplog.at_level(logging.ERROR, logger="flightfeed.server.tenants"):
            assert not registry.reload()
        assert registry.table is before and registry.failed_reloads == 1
        (line,) = [r.getMessage() for r in caplog.records if r.name == "flightfeed.server.tenants"]
        assert "tenants not reloaded, the ones in force stay" in line and "datasets is missing" in line
        assert "\n" not in line
        assert _open(srv.location, "vision-token", "imagenet-val").read_all().num_rows > 0


def test_the_watcher_reloads_on_a_change_of_the_file_and_on_request(small_dir: Path, tmp_path: Path) -> None:
    with tenant_server(small_dir, tmp_path) as (srv, registry, path):
        reloaded = threading.Event()
        registry.on_reload.append(lambda _table: reloaded.set())
        registry.start(interval=0.05)
        try:
            text = path.read_text().replace('datasets = ["imagenet*"]', 'datasets = ["imagenet*"]\ntoken = "v3"', 1)
            path.write_text(text)
            assert reloaded.wait(30)  # (a wait for the event, not a timing claim: bench/ measures the delay)
            assert _open(srv.location, "v3", "imagenet-val").read_all().num_rows > 0
            reloaded.clear()
            registry.request_reload()  # what SIGHUP does (serve installs it)
            assert reloaded.wait(30)
        finally:
            registry.stop()


def test_sighup_asks_serve_for_a_reload(tmp_path: Path) -> None:
    from flightfeed.server.serve.tenants_setup import setup_tenants

    path = tmp_path / "t.toml"
    path.write_text('[tenant.a]\ntoken = "a-token"\ndatasets = ["*"]\n')
    old = signal.getsignal(signal.SIGHUP)
    setup = setup_tenants(str(path), None, None, {})
    try:
        assert setup.registry is not None and setup.token and setup.token_file
        assert oct(os.stat(setup.token_file).st_mode & 0o777) == "0o600"
        reloaded = threading.Event()
        setup.registry.on_reload.append(lambda _table: reloaded.set())
        os.kill(os.getpid(), signal.SIGHUP)
        assert reloaded.wait(30)
    finally:
        if setup.registry is not None:
            setup.registry.stop()
        signal.signal(signal.SIGHUP, old)


def test_load_tenants_is_what_a_reload_reads(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[tenant.a]\ntoken = "a-token"\ndatasets = ["*"]\n')
    first = load_tenants(str(path), SECRETS)
    assert load_tenants(str(path), SECRETS).tenants == first.tenants  # hashed once: stable across reloads


def test_the_torch_client_raises_permission_denied_when_its_token_is_revoked_mid_epoch(
    big_dir: Path, tmp_path: Path
) -> None:
    from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
    from flightfeed.client import PermissionDenied as ClientPermissionDenied

    with tenant_server(big_dir, tmp_path, message_bytes=64 << 10) as (srv, registry, path):
        ds = FlightDataset(srv.location, "imagenet-train", batch_size=256, shuffle=False,
                           connect=ConnectOptions(token="vision-token"),
                           options=ReadOptions(streams=1, report_interval=None))
        batches = iter(ds)
        seen = len(next(batches)["index"])
        path.write_text(ROTATED.format(speech=_hashes(registry, "speech")))
        assert registry.reload()
        counted = [seen]

        def rest() -> None:
            for batch in batches:
                counted.append(len(batch["index"]))

        with pytest.raises(ClientPermissionDenied, match="tenant 'vision' may not read dataset 'imagenet-train'"):
            rest()
        assert 0 < sum(counted) < BIG_ROWS  # stopped, not retried into a full epoch
