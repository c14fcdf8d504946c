"""Transforms through real servers and the torch client: byte-identical augmentation whatever
the streams, DataLoader workers or a mid-epoch resume; skipped rows counted, never silent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ShardError, StaleState
from tests.transforms.conftest import CORRUPT, ROWS, MakeImages

Sample = dict[int, bytes]


def samples(batches: Any) -> list[tuple[int, bytes]]:
    """(stored index, image bytes) in delivery order."""
    out = []
    for b in batches:
        assert b["image"].dtype == torch.uint8
        for i, img in zip(b["index"].tolist(), b["image"], strict=True):
            out.append((i, img.numpy().tobytes()))
    return out


@pytest.fixture(scope="module")
def reference(image_server: RunningServer) -> list[tuple[int, bytes]]:
    from flightfeed.client import FlightDataset, ReadOptions

    ds = FlightDataset(
        image_server.location,
        "imgs",
        batch_size=8,
        seed=1,
        rank=0,
        world_size=1,
        transform=[{"name": "decode"}, {"name": "random_resized_crop", "size": 32}, {"name": "hflip"}],
        options=ReadOptions(report_interval=None, streams=1, on_decode_error="skip"),
    )
    try:
        return samples(ds)
    finally:
        ds.close()


def test_every_good_row_once_and_skips_counted(make_images: MakeImages, image_server: RunningServer,
                                                reference: list[tuple[int, bytes]]) -> None:
    got = [i for i, _ in reference]
    assert sorted(got) == sorted(set(range(ROWS)) - set(CORRUPT))
    before = image_server.metrics.registry.get_sample_value("flightfeed_rows_skipped_total", {"dataset": "imgs"})
    image_server.server.share_window.clear()  # decode again (else the reference's messages are shared)
    ds = make_images(streams=3)
    again = samples(ds)
    assert again == reference  # byte-identical across stream counts
    assert ds.stats()["rows_skipped"] == len(CORRUPT)
    after = image_server.metrics.registry.get_sample_value("flightfeed_rows_skipped_total", {"dataset": "imgs"})
    assert (after or 0) - (before or 0) == len(CORRUPT)
    assert image_server.metrics.registry.get_sample_value("flightfeed_decode_errors_total", {"dataset": "imgs"})
    snap = metrics_snapshot(image_server.metrics, include_prometheus=False)  # what /stats and the dashboard show
    decode = {d["name"]: d["decode"] for d in snap["datasets"]}["imgs"]
    assert decode["rows_skipped"] >= len(CORRUPT)
    assert decode["rows_decoded"] >= ROWS - len(CORRUPT)
    assert decode["messages"] > 0
    assert 0 < decode["pool_busy_ratio"] <= 1


def test_shape_and_epochs(make_images: MakeImages, reference: list[tuple[int, bytes]]) -> None:
    ds = make_images(streams=2)
    first = next(iter(ds))
    assert tuple(first["image"].shape) == (8, 32, 32, 3)
    ds.set_epoch(1)
    epoch1 = dict(samples(ds))
    epoch0 = dict(reference)
    assert epoch1.keys() == epoch0.keys()
    changed = sum(epoch1[i] != epoch0[i] for i in epoch0)
    assert changed > len(epoch0) // 2  # new draws each epoch


@pytest.mark.parametrize("stop_after", [1, 6])
def test_resume_mid_epoch_is_byte_identical(make_images: MakeImages, reference: list[tuple[int, bytes]],
                                            stop_after: int) -> None:
    ds = make_images(streams=2)
    head: list[Any] = []
    for k, batch in enumerate(ds):
        head.append(batch)
        if k + 1 == stop_after:
            break
    state = ds.state_dict()
    resumed = make_images(streams=4)
    resumed.load_state_dict(state)
    assert samples(head) + samples(resumed) == reference


def test_a_checkpoint_needs_the_same_transform(make_images: MakeImages) -> None:
    ds = make_images()
    next(iter(ds))
    other = make_images(transform="imagenet_val")
    with pytest.raises(StaleState, match=r"transform: checkpoint \[\{'name': 'decode'\}"):
        other.load_state_dict(ds.state_dict())


def test_dataloader_workers_give_the_same_samples(make_images: MakeImages,
                                                  reference: list[tuple[int, bytes]]) -> None:
    ds = make_images(streams=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = samples(loader)
    assert got == reference  # canonical order, same draws


def test_raise_names_dataset_row_and_shard(make_images: MakeImages) -> None:
    ds = make_images(on_decode_error="raise", shuffle=False)
    with pytest.raises(ShardError, match=rf"dataset 'imgs': stored row {CORRUPT[0]} \(shard .*part-00000.arrow\)"):
        for _ in ds:
            pass


def test_val_preset_is_deterministic_and_fixed_size(make_images: MakeImages) -> None:
    ds = make_images(transform=[{"name": "decode"}, {"name": "resize", "size": 40}, {"name": "center_crop", "size": 36},
                                {"name": "to_chw"}], streams=2)
    a = samples(ds)
    b = samples(make_images(transform=ds.transform, streams=1))
    assert a == b
    first = next(iter(make_images(transform=ds.transform)))
    assert tuple(first["image"].shape) == (8, 3, 36, 36)


def test_row_index_follows_transforms_and_skipped_rows(make_images: MakeImages) -> None:
    """``with_index``: the stored row of each transformed row; rows that did not decode are gone from
    ``row_index`` too (the index is added before they are dropped)."""
    ds = make_images(streams=2, with_index=True)
    ds.set_epoch(1)
    seen = []
    for b in ds:
        assert b["row_index"].tolist() == b["index"].tolist()
        seen += b["row_index"].tolist()
    assert sorted(seen) == [i for i in range(ROWS) if i not in CORRUPT]
