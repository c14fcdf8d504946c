"""Decode on the trainer: the node's ``defer_decode`` sends bytes + crop + flip equal to its own
decode path's boxes; the client's trainer decode (crop/resize/flip in torch) matches the node's
pixels within tolerance; normalised float CHW output; the CUDA decode where CUDA exists."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from flightfeed.client import ConfigError, FlightDataset, ReadOptions
from flightfeed.client._images.normalize import IMAGENET_MEAN, IMAGENET_STD
from flightfeed.client._images.trainer_decode import torchvision_decoder
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.transforms import DrawKey, Transformer
from flightfeed.server.transforms.deferred import frame_params
from flightfeed.server.transforms.execute import prepare_row
from flightfeed.wire.errors import InvalidRequest
from tests.transforms.conftest import CORRUPT, ROWS, STEPS, MakeImages
from tests.transforms.images import write_images
from tests.transforms.test_native_decode import steps_of

DEFER = [*STEPS, {"name": "defer_decode"}]


def pillow_decoder(data: list[torch.Tensor], device: torch.device, mode: str) -> list[torch.Tensor]:
    """Stands in for nvJPEG on CPU: CHW uint8 tensors."""
    out = []
    for d in data:
        img = Image.open(io.BytesIO(d.numpy().tobytes())).convert(mode)
        arr = np.asarray(img)
        out.append(torch.from_numpy(arr.copy()).reshape(arr.shape[0], arr.shape[1], -1).permute(2, 0, 1).to(device))
    return out


def rows_of(batches: Any, key: str = "image") -> dict[int, Any]:
    out: dict[int, Any] = {}
    for b in batches:
        for k, i in enumerate(b["index"].tolist()):
            out[i] = {name: v[k] for name, v in b.items()}
    return out


def test_params_are_the_node_decode_paths_boxes(make_images: MakeImages, image_server: RunningServer) -> None:
    ds = make_images(transform=DEFER, streams=2)
    got = rows_of(ds)
    # headers only: a truncated JPEG passes unless the cut reaches its header (then skipped, counted)
    assert set(range(ROWS)) - set(CORRUPT) <= set(got)
    assert ds.stats()["rows_skipped"] == ROWS - len(got)
    fingerprint = image_server.catalog.get("imgs").fingerprint
    key = DrawKey(fingerprint, seed=1, epoch=0)
    steps = steps_of(STEPS)
    for i, row in got.items():
        assert isinstance(row["image"], bytes)
        assert row["image_crop"].dtype == torch.int32 and row["image_crop"].shape == (4,)
        frame = prepare_row(row["image"], steps, key, i)  # exactly what the node's decode path draws
        box, flip = frame_params(frame)
        assert tuple(row["image_crop"].tolist()) == box
        assert bool(row["image_flip"]) == flip
    # the same boxes with any number of streams, and a new set next epoch
    again = rows_of(make_images(transform=DEFER, streams=3))
    assert all(torch.equal(again[i]["image_crop"], got[i]["image_crop"]) for i in got)
    ds.set_epoch(1)
    later = rows_of(ds)
    assert sum(not torch.equal(later[i]["image_crop"], got[i]["image_crop"]) for i in got) > ROWS // 2


def tolerant_decoder(data: list[torch.Tensor], device: torch.device, mode: str) -> list[torch.Tensor]:
    """pillow_decoder, with a blank image for bytes that do not decode (the truncated rows)."""
    out = []
    for d in data:
        try:
            out.extend(pillow_decoder([d], device, mode))
        except OSError:
            out.append(torch.zeros((3, 8, 8), dtype=torch.uint8, device=device))
    return out


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a.int() - b.int()).abs().float().mean())


def test_preset_then_defer_keeps_the_presets_draws(make_images: MakeImages) -> None:
    node = rows_of(make_images(transform="imagenet_train"))
    ds = make_images(transform="imagenet_train", decode_on="trainer")  # the client appends defer_decode
    ds._image_decoder = tolerant_decoder
    trainer = rows_of(ds)
    assert set(range(ROWS)) - set(CORRUPT) <= set(trainer)
    assert set(trainer[0]) == {"image", "label", "index"}  # crop/flip consumed
    for i in sorted(set(node) - set(CORRUPT)):
        assert trainer[i]["image"].shape == (224, 224, 3) and trainer[i]["image"].dtype == torch.uint8
        assert mean_abs(trainer[i]["image"], node[i]["image"]) <= 6.0, i


def test_trainer_decode_matches_the_node_within_tolerance(make_images: MakeImages) -> None:
    node = rows_of(make_images(transform=STEPS))
    ds = make_images(transform=STEPS, decode_on="trainer")
    ds._image_decoder = pillow_decoder
    with pytest.raises(OSError, match="truncated"):  # a bad JPEG fails on the trainer, not silently
        list(ds)
    ds = make_images(transform=STEPS, decode_on="trainer", normalize=True)
    ds._image_decoder = tolerant_decoder
    got = rows_of(ds)
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    for i in sorted(set(node) - set(CORRUPT)):
        x = got[i]["image"]
        assert x.dtype == torch.float32 and x.shape == (3, 32, 32)
        pixels = (x * std + mean) * 255
        assert float((pixels - node[i]["image"].permute(2, 0, 1).float()).abs().mean()) <= 6.0, i


def test_normalize_gives_float_chw_on_the_device(make_images: MakeImages) -> None:
    plain = rows_of(make_images(transform=STEPS))
    normed = rows_of(make_images(transform=STEPS, normalize=True))
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    for i, row in normed.items():
        x = row["image"]
        assert x.dtype == torch.float32 and x.shape == (3, 32, 32)
        expect = (plain[i]["image"].permute(2, 0, 1).float() / 255 - mean) / std
        torch.testing.assert_close(x, expect, rtol=1e-5, atol=1e-5)
    custom = rows_of(make_images(transform=[*STEPS, {"name": "to_chw"}], normalize=((0.5,) * 3, (0.25,) * 3)))
    for i, row in custom.items():
        torch.testing.assert_close(row["image"], (plain[i]["image"].permute(2, 0, 1).float() / 255 - 0.5) / 0.25)


def test_bad_options_are_refused_clearly(make_images: MakeImages) -> None:
    with pytest.raises(ConfigError, match="normalize"):
        make_images(normalize="yes")
    with pytest.raises(ConfigError, match="decode_on"):
        make_images(decode_on="gpu")
    with pytest.raises(ConfigError, match="needs a transform"):
        make_images(transform=None, decode_on="trainer")
    with pytest.raises(ConfigError, match="normalize needs column 'image'"):
        list(make_images(transform=None, normalize=True))
    with pytest.raises(InvalidRequest, match="defer_decode"):
        list(make_images(transform=[*STEPS, {"name": "to_chw"}, {"name": "defer_decode"}]))
    with pytest.raises(InvalidRequest, match="last step"):
        list(make_images(transform=[{"name": "decode"}, {"name": "defer_decode"}, {"name": "center_crop", "size": 8}]))


def test_without_torchvision_the_trainer_decode_says_what_is_missing() -> None:
    try:
        import torchvision.io  # noqa: F401
    except Exception:
        with pytest.raises(ConfigError, match="torchvision"):
            torchvision_decoder()
    else:
        assert callable(torchvision_decoder())


@pytest.fixture(scope="module")
def clean_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("clean-jpegs")
    write_images(root, [40])
    with running_server({"imgs": str(root)}, transformer=Transformer(workers=2)) as srv:
        yield srv


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_decode_matches_the_node(clean_server: RunningServer) -> None:
    def read(**kw: Any) -> dict[int, Any]:
        device = kw.pop("device", None)
        ds = FlightDataset(clean_server.location, "imgs", batch_size=8, seed=1, rank=0, world_size=1,
                           transform=STEPS, device=device, options=ReadOptions(report_interval=None, **kw))
        try:
            return rows_of(ds)
        finally:
            ds.close()

    node, gpu = read(), read(decode_on="trainer", device="cuda")
    assert sorted(gpu) == sorted(node) == list(range(40))
    for i, row in gpu.items():
        assert row["image"].device.type == "cuda"
        assert mean_abs(row["image"].cpu(), node[i]["image"]) <= 6.0, i
