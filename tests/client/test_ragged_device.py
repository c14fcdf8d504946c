"""Ragged columns and packed token windows through the device path (the streams' pinned ring and
the mover, CPU engine): a jagged column crosses the ring as values + offsets and is rebuilt per
batch, a padded one as plain tensors, string lists stay on the host -- the same bits as the host
path, in the same order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from flightfeed.client import FlightDataset, Pack, ReadOptions
from flightfeed.client._device.engines import CpuEngine
from flightfeed.server.testing import RunningServer, running_server
from tests.client.ragged_data import NAME, ROWS, check_batch, write_ragged
from tests.support.token_corpus import write_token_corpus


@pytest.fixture(scope="module")
def ragged_location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("ragged-device")
    write_ragged(root)
    srv: RunningServer
    with running_server({NAME: str(root)}) as srv:
        yield srv.location


@pytest.mark.parametrize(
    ("ragged", "policy"),
    [("nested", {}), ({"tokens": "padded", "wide": "nested"}, {"tokens": "padded"})],
    ids=["nested", "mixed"],
)
def test_ragged_columns_cross_the_ring_bit_exact(ragged_location: str, ragged: Any, policy: dict[str, str]) -> None:
    def make(device: str | None) -> FlightDataset:
        read = ReadOptions(streams=3, report_interval=None, message_rows=64, ragged=ragged, pad_value=7)
        ds = FlightDataset(ragged_location, NAME, batch_size=32, shuffle=True, seed=4, device=device, options=read)
        if device is not None:
            ds._copy_engine = CpuEngine
        return ds

    host, device = make(None), make("cpu")
    try:
        expected = [check_batch(b, policy, 7) for b in host]
        got = [check_batch(b, policy, 7) for b in device]
        assert got == expected and sorted(i for b in got for i in b) == list(range(ROWS))
        ring = device._devices[0].ring
        assert ring is not None and ring.staged > 0 and ring.spilled == 0
    finally:
        host.close()
        device.close()


def test_packed_token_windows_through_the_device_path(tmp_path: Path) -> None:
    """``ReadOptions(pack=...)`` on the device path: the same windows, widened the same way."""
    write_token_corpus(tmp_path, [[40, 25], [7], [60, 1, 30]], seed=3, max_len=45)
    with running_server({"tok": str(tmp_path)}) as srv:
        def make(device: str | None) -> FlightDataset:
            opts = ReadOptions(pack=Pack(column="tokens", seq_len=16, pad_id=-7), report_interval=None, streams=2)
            ds = FlightDataset(srv.location, "tok", batch_size=3, device=device, options=opts)
            if device is not None:
                ds._copy_engine = CpuEngine
            return ds

        host, device = make(None), make("cpu")
        try:
            expected, got = list(host), list(device)
            assert len(got) == len(expected) > 0
            for a, b in zip(expected, got, strict=True):
                assert set(a) == set(b)
                for k in a:
                    assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
            assert device._devices[0].ring is not None and device._devices[0].ring.staged > 0
        finally:
            host.close()
            device.close()
