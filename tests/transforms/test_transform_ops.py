"""Every built-in step against a Pillow/numpy reference (within resampling tolerance)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from flightfeed.server.transforms import DrawKey, compile_plan, default_registry, row_generator, run_row
from flightfeed.server.transforms.ops import center_offsets, resized_shorter, rrc_params
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from flightfeed.wire.transforms import set_transform
from tests.transforms.images import SCHEMA, encode, picture

KEY = DrawKey("feedface", seed=3, epoch=1)
W, H = 97, 81


def run(steps: list[Any], data: Any, row: int = 5) -> np.ndarray:
    cmd = ReadCommand(version=WIRE_VERSION, dataset="d", world_size=1, batch_rows=1, streams=1, num_workers=1)
    set_transform(cmd, steps)
    plan = compile_plan(SCHEMA, cmd, default_registry())
    assert plan is not None
    (column,) = plan.columns
    out = run_row(data, column.row_steps, KEY, row)
    assert out.shape == tuple(column.output.shape)
    assert out.dtype == np.dtype(column.output.dtype)
    return np.asarray(out)


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return encode(picture(1, W, H), "JPEG", quality=92)


def reference(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def close(a: np.ndarray, b: np.ndarray, mean: float) -> None:
    assert a.shape == b.shape
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    assert diff.mean() <= mean, f"mean abs difference {diff.mean():.2f} > {mean}"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_decode_equals_pillow(fmt: str) -> None:
    data = encode(picture(2, W, H), fmt)
    steps = [{"name": "decode"}, {"name": "center_crop", "size": 64}]
    ref = np.asarray(reference(data))
    left, top = center_offsets(W, H, 64, 64)
    assert np.array_equal(run(steps, data), ref[top : top + 64, left : left + 64])


def test_decode_grayscale(jpeg: bytes) -> None:
    out = run([{"name": "decode", "mode": "L"}, {"name": "center_crop", "size": 32}], jpeg)
    ref = np.asarray(Image.open(io.BytesIO(jpeg)).convert("L"))
    left, top = center_offsets(W, H, 32, 32)
    assert out.shape == (32, 32, 1)
    assert np.array_equal(out[:, :, 0], ref[top : top + 32, left : left + 32])


@pytest.mark.parametrize("draft", [True, False])
def test_resize_then_center_crop_match_pillow(jpeg: bytes, draft: bool) -> None:
    steps = [{"name": "decode", "draft": draft}, {"name": "resize", "size": 40}, {"name": "center_crop", "size": 36}]
    img = reference(jpeg)
    size = resized_shorter(W, H, 40)
    resized = img.resize(size, Image.Resampling.BILINEAR)
    left, top = center_offsets(size[0], size[1], 36, 36)
    ref = np.asarray(resized)[top : top + 36, left : left + 36]
    close(run(steps, jpeg), ref, mean=3.0 if draft else 1.0)


def test_center_crop_larger_than_image_pads_with_zeros(jpeg: bytes) -> None:
    out = run([{"name": "decode"}, {"name": "center_crop", "size": 100}], jpeg)
    left, top = center_offsets(W, H, 100, 100)
    ref = np.asarray(reference(jpeg).crop((left, top, left + 100, top + 100)))
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("row", [0, 1, 2, 3])
def test_random_resized_crop_and_hflip_match_pillow(jpeg: bytes, row: int) -> None:
    steps = [{"name": "decode"}, {"name": "random_resized_crop", "size": 24, "scale": [0.2, 1.0]}, {"name": "hflip"}]
    left, top, w, h = rrc_params(W, H, (0.2, 1.0), (3 / 4, 4 / 3), row_generator(KEY, row, 1))
    ref_img = reference(jpeg).resize((24, 24), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    ref = np.asarray(ref_img)
    if row_generator(KEY, row, 2).random() < 0.5:
        ref = ref[:, ::-1]
    close(run(steps, jpeg, row), ref, mean=4.0)


def test_hflip_p1_mirrors_and_p0_keeps(jpeg: bytes) -> None:
    base: list[dict[str, Any]] = [{"name": "decode"}, {"name": "center_crop", "size": 40}]
    plain = run(base, jpeg)
    assert np.array_equal(run([*base, {"name": "hflip", "p": 1.0}], jpeg), plain[:, ::-1])
    assert np.array_equal(run([*base, {"name": "hflip", "p": 0.0}], jpeg), plain)


def test_crop_after_flip_is_the_mirrored_crop(jpeg: bytes) -> None:
    # hflip then an off-centre crop must equal: crop of the mirrored image
    steps = [{"name": "decode"}, {"name": "hflip", "p": 1.0}, {"name": "center_crop", "size": 50}]
    mirrored = np.asarray(reference(jpeg))[:, ::-1]
    left, top = center_offsets(W, H, 50, 50)
    assert np.array_equal(run(steps, jpeg), mirrored[top : top + 50, left : left + 50])


def test_to_chw_and_cast(jpeg: bytes) -> None:
    base: list[dict[str, Any]] = [{"name": "decode"}, {"name": "center_crop", "size": 16}]
    hwc = run(base, jpeg)
    chw = run([*base, {"name": "to_chw"}], jpeg)
    assert np.array_equal(chw, hwc.transpose(2, 0, 1))
    scaled = run([*base, {"name": "cast", "dtype": "float32", "scale": 1 / 255}], jpeg)
    assert scaled.dtype == np.float32
    np.testing.assert_allclose(scaled, hwc.astype(np.float32) / 255, rtol=1e-6)


def test_draws_depend_on_row_epoch_and_step_only() -> None:
    a = row_generator(KEY, 7, 1).random(4)
    assert np.array_equal(a, row_generator(DrawKey("feedface", 3, 1), 7, 1).random(4))
    for other in (row_generator(KEY, 8, 1), row_generator(KEY, 7, 2), row_generator(DrawKey("feedface", 3, 2), 7, 1)):
        assert not np.array_equal(a, other.random(4))


@pytest.mark.parametrize("seed", [0, 3, 2**32 - 1, 2**32, 2**64 - 1, -1])
def test_row_generator_draws_are_numpys_seed_sequence_philox_bit_for_bit(seed: int) -> None:
    """The key derivation is numpy's ``SeedSequence`` reimplemented (it cost a tenth of a JPEG
    row's decode + augment, GIL held): the draws stay those of
    ``Generator(Philox(SeedSequence([fingerprint word, seed, epoch, row, step])))``, so every
    augmentation of every epoch served before is unchanged. Rows and epochs across the 32-bit
    word boundaries (the entropy's word count changes there)."""
    from flightfeed.server.transforms.rng import philox_key

    mask = (1 << 64) - 1
    for fingerprint in ("feedface", "cafe", ""):
        key = DrawKey(fingerprint, seed=seed, epoch=7)
        for row in (0, 1, 5, 2**32 - 1, 2**32, 2**40 + 3, 2**64 - 1):
            for step in (0, 1, 2):
                entropy = [key.fingerprint_word, key.seed & mask, key.epoch & mask, row & mask, step & mask]
                want = np.random.Generator(np.random.Philox(np.random.SeedSequence(entropy)))
                got = row_generator(key, row, step)
                assert np.array_equal(got.bit_generator.state["state"]["key"], want.bit_generator.state["state"]["key"])
                assert np.array_equal(got.random(4), want.random(4))
                assert np.array_equal(got.integers(0, 1000, 4), want.integers(0, 1000, 4))
    rng = np.random.default_rng(seed & 0xFFFF)
    for _ in range(300):
        drawn = rng.integers(0, 2**63, rng.integers(1, 7), dtype=np.int64) >> rng.integers(0, 63)
        values = tuple(int(v) for v in drawn)
        assert np.array_equal(philox_key(values), np.random.SeedSequence(list(values)).generate_state(2, np.uint64))
