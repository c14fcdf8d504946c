"""The trainer decode's batched JPEG decoders (``client._jpeg_decoders``).

nvImageCodec cannot run here (no CUDA, and its wheel needs the CUDA runtime), so the CPU tests
drive our side of it -- byte views in, CHW uint8 tensors out, modes, a failed image -- through a
stand-in module with nvImageCodec's API that decodes with Pillow. The CUDA tests compare the real
nvImageCodec with torchvision's nvJPEG on the same bytes where both are installed.
"""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from PIL import Image

from flightfeed.client._images.jpeg import backend_of, default_decoder, nvimgcodec_decoder, torchvision_decoder
from flightfeed.wire.errors import ConfigError, ShardError
from tests.transforms.images import encode, picture


class _Decoder:
    """nvImageCodec's ``Decoder`` as far as the client uses it: a list of encoded sources in, one
    HWC image (or None) out per source, in order."""

    made: ClassVar[list[Any]] = []

    def __init__(self, device_id: int = -1) -> None:
        self.device_id = device_id
        _Decoder.made.append(self)

    def decode(self, sources: list[Any], params: Any = None, cuda_stream: int = 0) -> list[Any]:
        assert cuda_stream == 0 and params.apply_exif_orientation is False
        out: list[Any] = []
        for s in sources:
            assert isinstance(s, np.ndarray) and s.dtype == np.uint8 and s.ndim == 1  # views, not copies to bytes
            try:
                img = Image.open(io.BytesIO(s.tobytes()))
                img.load()
            except Exception:
                out.append(None)  # nvImageCodec returns None for an image it cannot decode
                continue
            arr = np.asarray(img.convert("L" if params.color_spec == "gray" else "RGB"))
            out.append(arr if arr.ndim == 3 else arr[:, :, None])
        return out


STAND_IN = SimpleNamespace(
    Decoder=_Decoder,
    ColorSpec=SimpleNamespace(RGB="rgb", GRAY="gray"),
    DecodeParams=lambda **kw: SimpleNamespace(**kw),
    CodeStream=lambda s: s,
)


def _views(blobs: list[bytes]) -> list[torch.Tensor]:
    return [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]


def _pillow_chw(blob: bytes, mode: str) -> torch.Tensor:
    arr = np.asarray(Image.open(io.BytesIO(blob)).convert(mode))
    return torch.from_numpy(arr.copy()).reshape(arr.shape[0], arr.shape[1], -1).permute(2, 0, 1)


BLOBS = [encode(picture(i, 40 + 8 * i, 30 + 4 * i)) for i in range(5)]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_images_come_back_chw_in_batch_order(mode: str) -> None:
    decode = nvimgcodec_decoder(STAND_IN)
    assert decode is not None and backend_of(decode) == "nvimgcodec"
    out = decode(_views(BLOBS), torch.device("cpu"), mode)
    assert len(out) == len(BLOBS)
    for blob, got in zip(BLOBS, out, strict=True):
        want = _pillow_chw(blob, mode)
        assert got.dtype == torch.uint8 and got.shape == want.shape and torch.equal(got, want)


def test_one_decoder_per_device_is_kept() -> None:
    _Decoder.made.clear()
    decode = nvimgcodec_decoder(STAND_IN)
    assert decode is not None
    for _ in range(3):
        decode(_views(BLOBS[:2]), torch.device("cpu"), "RGB")
    assert len(_Decoder.made) == 1


def test_an_image_it_cannot_decode_is_an_error_naming_it() -> None:
    decode = nvimgcodec_decoder(STAND_IN)
    assert decode is not None
    with pytest.raises(ShardError, match=r"image 1 of the batch \(7 bytes\)"):
        decode(_views([BLOBS[0], b"notjpeg", BLOBS[2]]), torch.device("cpu"), "RGB")


def test_the_default_is_torchvision_or_a_clear_error() -> None:
    try:
        torchvision_decoder()
    except ConfigError:  # missing here, or a build that does not load beside this torch
        with pytest.raises(ConfigError, match="torchvision"):
            default_decoder(torch.device("cpu"))
    else:
        assert backend_of(default_decoder(torch.device("cpu"))) == "torchvision"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvimgcodec_matches_torchvision_on_the_gpu() -> None:
    decode = nvimgcodec_decoder()
    if decode is None:
        pytest.skip("nvidia-nvimgcodec is not installed")
    device = torch.device("cuda")
    assert backend_of(default_decoder(device)) == "torchvision"  # measured faster: torchvision first
    blobs = [encode(picture(i, 224 + 16 * i, 160 + 8 * i)) for i in range(8)]
    views = _views(blobs)
    for mode in ("RGB", "L"):
        ours = decode(views, device, mode)
        theirs = torchvision_decoder()(views, device, mode)
        for a, b in zip(ours, theirs, strict=True):
            assert a.device.type == "cuda" and a.shape == b.shape
            assert float((a.int() - b.int()).abs().float().mean()) <= 2.0
