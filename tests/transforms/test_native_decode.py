"""The native decode path (libjpeg-turbo at a DCT scale + one OpenCV resample) against the Pillow
path: the same boxes and flips (draws untouched), pixels within the documented tolerance, the
crop/flip distributions of torchvision's definitions, and every case that must fall back."""

from __future__ import annotations

import io
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flightfeed.server.storage import open_dataset
from flightfeed.server.transforms import (
    DrawKey,
    Transformer,
    compile_plan,
    default_registry,
    native,
    row_generator,
    run_row,
)
from flightfeed.server.transforms.execute import prepare_row
from flightfeed.server.transforms.frame import Frame
from flightfeed.server.transforms.ops import center_offsets, resized_shorter, rrc_params
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from flightfeed.wire.transforms import set_transform
from tests.transforms.conftest import CORRUPT
from tests.transforms.images import SCHEMA, encode, picture

KEY = DrawKey("cafe", seed=7, epoch=2)
TRAIN: list[dict[str, Any]] = [{"name": "decode"}, {"name": "random_resized_crop", "size": 224}, {"name": "hflip"}]
VAL: list[dict[str, Any]] = [{"name": "decode"}, {"name": "resize", "size": 256}, {"name": "center_crop", "size": 224}]

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="simplejpeg/opencv-python-headless not installed")


def steps_of(steps: list[dict[str, Any]], backend: str = "native") -> Any:
    cmd = ReadCommand(version=WIRE_VERSION, dataset="d", world_size=1, batch_rows=1, streams=1, num_workers=1)
    first = dict(steps[0], backend=backend)
    set_transform(cmd, [first, *steps[1:]])
    plan = compile_plan(SCHEMA, cmd, default_registry())
    assert plan is not None
    return plan.columns[0].row_steps


def textured(index: int, width: int = 500, height: int = 375) -> bytes:
    """An ImageNet-like JPEG: ~500x375, fine texture (~100 KB at quality 90)."""
    rng = np.random.default_rng(index)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 3 + y + index) % 256, (y * 5 + index * 7) % 256, (x * y // 7) % 256], -1)
    pixels = (base + rng.integers(-12, 12, base.shape)).clip(0, 255).astype(np.uint8)
    return encode(pixels, "JPEG", quality=90)


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return [textured(i, 440 + 17 * i, 330 + 11 * i) for i in range(6)]


@pytest.fixture(scope="module")
def smooth() -> list[bytes]:
    return [encode(picture(i, 480 + 9 * i, 360 + 5 * i), "JPEG", quality=92) for i in range(6)]


def mad(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# -- the draws: untouched --------------------------------------------------------------------------
def test_native_frames_open_from_the_header_only(photos: list[bytes]) -> None:
    f = Frame.open(photos[0], "RGB")
    assert f.native and f._image is None
    with Image.open(io.BytesIO(photos[0])) as ref:
        assert f.full == ref.size


@pytest.mark.parametrize("steps", [TRAIN, VAL], ids=["train", "val"])
def test_boxes_and_flips_equal_the_pillow_path_and_torchvision_definitions(photos: list[bytes], steps: Any) -> None:
    fast, slow = steps_of(steps, "native"), steps_of(steps, "pillow")
    for row in range(40):
        data = photos[row % len(photos)]
        a, b = prepare_row(data, fast, KEY, row), prepare_row(data, slow, KEY, row)
        assert a.native and not b.native
        assert (a.box, a.flip, a.size) == (b.box, b.flip, b.size)
        w, h = a.full
        if steps is TRAIN:  # torchvision's RandomResizedCrop.get_params with this row's generator
            left, top, cw, ch = rrc_params(w, h, (0.08, 1.0), (3 / 4, 4 / 3), row_generator(KEY, row, 1))
            flip = row_generator(KEY, row, 2).random() < 0.5
            assert a.flip == flip
            if flip:
                assert a.box == (float(left), float(top), float(left + cw), float(top + ch))
            else:
                assert a.box == (left, top, left + cw, top + ch)
        else:  # Resize(256) then CenterCrop(224), mapped back to source pixels
            rw, rh = resized_shorter(w, h, 256)
            left, top = center_offsets(rw, rh, 224, 224)
            expect = (left * w / rw, top * h / rh, (left + 224) * w / rw, (top + 224) * h / rh)
            assert a.box == pytest.approx(expect)


# -- the pixels: within the documented tolerance -----------------------------------------------------
@pytest.mark.parametrize(
    ("steps", "textured_limit"), [(TRAIN, 2.5), (VAL, 4.0)], ids=["train", "val"]
)
def test_pixels_within_tolerance_of_full_decode_plus_pillow(
    photos: list[bytes], smooth: list[bytes], steps: Any, textured_limit: float
) -> None:
    fast, slow = steps_of(steps, "native"), steps_of(steps, "pillow")
    for data, limit in [*((p, textured_limit) for p in photos), *((s, 0.5) for s in smooth)]:
        for row in range(4):
            out = run_row(data, fast, KEY, row)
            assert out.shape == (224, 224, 3) and out.dtype == np.uint8
            assert mad(out, run_row(data, slow, KEY, row)) <= limit


def test_dct_scale_is_the_smallest_power_of_two_that_covers_the_output() -> None:
    full = (2000, 1500)
    assert native.decode_scale(full, (0, 0, 2000, 1500), (224, 224)) == 4  # 1500/8 < 224 <= 1500/4
    assert native.decode_scale(full, (0, 0, 2000, 1500), (100, 100)) == 8
    assert native.decode_scale(full, (0, 0, 400, 400), (224, 224)) == 1  # a small box needs every pixel
    assert native.decode_scale(full, (0, 0, 900, 900), (224, 224)) == 4
    assert native.decode_scale((500, 375), (0, 0, 500, 375), (224, 224)) == 1  # 375/2 < 224


def test_large_images_decode_at_a_dct_scale_within_tolerance() -> None:
    data = encode(picture(3, 1800, 1400), "JPEG", quality=92)
    for steps in (TRAIN, VAL, [{"name": "decode", "draft": False}, {"name": "resize", "size": 64},
                               {"name": "center_crop", "size": 64}]):
        for row in range(3):
            out = run_row(data, steps_of(steps, "native"), KEY, row)
            assert mad(out, run_row(data, steps_of(steps, "pillow"), KEY, row)) <= 1.0


def test_grayscale_upscale_and_padding_match_pillow(smooth: list[bytes]) -> None:
    data = encode(picture(5, 60, 48), "JPEG", quality=95)
    cases: list[list[dict[str, Any]]] = [
        [{"name": "decode", "mode": "L"}, {"name": "random_resized_crop", "size": 80}, {"name": "hflip"}],
        [{"name": "decode"}, {"name": "resize", "size": 100}, {"name": "center_crop", "size": 120}],  # pads
        [{"name": "decode"}, {"name": "hflip", "p": 1.0}, {"name": "resize", "size": 70},
         {"name": "center_crop", "size": 64}],
    ]
    for steps in cases:
        for row in range(3):
            out = run_row(data, steps_of(steps, "native"), KEY, row)
            ref = run_row(data, steps_of(steps, "pillow"), KEY, row)
            assert mad(out, ref) <= 2.0, steps


def test_what_the_native_path_does_not_take_falls_back_to_pillow_exactly() -> None:
    pixels = picture(4, 90, 70)
    png = encode(pixels, "PNG")
    cmyk = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG", quality=95)
    jpeg = encode(pixels, "JPEG")
    assert native.jpeg_size(png) is None and native.jpeg_size(cmyk.getvalue()) is None
    assert native.jpeg_size(jpeg) == (90, 70)
    lanczos: list[dict[str, Any]] = [
        {"name": "decode"}, {"name": "random_resized_crop", "size": 40, "interpolation": "lanczos"}
    ]
    small_val: list[dict[str, Any]] = [{"name": "decode"}, {"name": "resize", "size": 56},
                                       {"name": "center_crop", "size": 48}]
    cases: list[tuple[bytes, list[dict[str, Any]]]] = [(png, TRAIN), (cmyk.getvalue(), small_val), (jpeg, lanczos)]
    for data, steps in cases:
        for row in range(3):
            assert np.array_equal(
                run_row(data, steps_of(steps, "native"), KEY, row), run_row(data, steps_of(steps, "pillow"), KEY, row)
            )


def test_undecodable_bytes_raise_on_both_paths() -> None:
    jpeg = textured(1, 200, 150)
    for backend in ("native", "pillow"):
        with pytest.raises((OSError, ValueError)):
            run_row(jpeg[: len(jpeg) // 3], steps_of(TRAIN, backend), KEY, 0)
        with pytest.raises((OSError, ValueError)):
            run_row(b"\xff\xd8 not a jpeg at all", steps_of(TRAIN, backend), KEY, 0)


# -- the distributions: torchvision's definitions ------------------------------------------------------
def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


def torchvision_reference(width: int, height: int, n: int) -> np.ndarray:
    """RandomResizedCrop.get_params as torchvision writes it (scale 0.08-1, log-uniform ratio
    3/4-4/3, ten tries, then the ratio-clamped centre crop), drawn with Python's generator."""
    rnd = random.Random(1234)
    area = width * height
    out = []
    for _ in range(n):
        for _ in range(10):
            target = area * rnd.uniform(0.08, 1.0)
            aspect = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                out.append((rnd.randint(0, width - w), rnd.randint(0, height - h), w, h))
                break
        else:  # the fallback: the whole image, its aspect ratio clamped into [3/4, 4/3], centred
            in_ratio = width / height
            if in_ratio < 3 / 4:
                w, h = width, round(width / (3 / 4))
            elif in_ratio > 4 / 3:
                w, h = round(height * (4 / 3)), height
            else:
                w, h = width, height
            out.append(((width - w) // 2, (height - h) // 2, w, h))
    return np.array(out, dtype=np.float64)


def features(boxes: np.ndarray, width: int, height: int) -> dict[str, np.ndarray]:
    left, top, w, h = boxes.T
    return {
        "area": w * h / (width * height),
        "log_ratio": np.log(w / h),
        "centre_x": (left + w / 2) / width,
        "centre_y": (top + h / 2) / height,
    }


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (640, 200)])
def test_crop_distribution_is_torchvisions(width: int, height: int) -> None:
    n = 6000
    ours = np.array(
        [rrc_params(width, height, (0.08, 1.0), (3 / 4, 4 / 3), row_generator(KEY, r, 1)) for r in range(n)],
        dtype=np.float64,
    )
    ref = torchvision_reference(width, height, n)
    critical = 1.95 * math.sqrt(2 / n)  # two-sample KS at alpha = 0.001
    fo, fr = features(ours, width, height), features(ref, width, height)
    for name in fo:
        assert ks_statistic(fo[name], fr[name]) < critical, name
    assert fo["area"].min() >= 0.08 - 0.01 and fo["area"].max() <= 1.0


def test_flip_rate_is_p_and_independent_of_the_crop() -> None:
    n = 8000
    flips = np.array([row_generator(KEY, r, 2).random() < 0.5 for r in range(n)])
    assert abs(flips.mean() - 0.5) < 4 * math.sqrt(0.25 / n)
    areas = np.array([rrc_params(500, 375, (0.08, 1.0), (3 / 4, 4 / 3), row_generator(KEY, r, 1))[2] for r in range(n)])
    assert abs(np.corrcoef(flips, areas)[0, 1]) < 4 / math.sqrt(n)
    p30 = np.array([row_generator(DrawKey("cafe", 7, 3), r, 2).random() < 0.3 for r in range(n)])
    assert abs(p30.mean() - 0.3) < 4 * math.sqrt(0.21 / n)


# -- the server's own buffers take the native path -----------------------------------------------------
def test_a_pyarrow_buffer_view_takes_the_native_path(photos: list[bytes]) -> None:
    view = memoryview(pa.py_buffer(photos[0]))
    assert view.format == "b"  # what a pyarrow buffer exposes: signed bytes (0xFF reads as -1)
    frame = Frame.open(view, "RGB")
    assert frame.native
    steps = steps_of(TRAIN)
    assert np.array_equal(run_row(view, steps, KEY, 3), run_row(photos[0], steps, KEY, 3))


def test_served_rows_decode_natively(image_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every JPEG row of a served message goes through the native renderer (PNGs and the
    truncated JPEGs do not), with the bytes straight from the shard's Arrow buffers."""
    calls: list[int] = []
    render = native.render

    def counted(*args: Any, **kw: Any) -> None:
        calls.append(1)
        render(*args, **kw)

    monkeypatch.setattr(native, "render", counted)
    cmd = ReadCommand(version=WIRE_VERSION, dataset="imgs", world_size=1, batch_rows=8, streams=1, num_workers=1)
    steps: list[dict[str, Any]] = [{"name": "decode"}, {"name": "random_resized_crop", "size": 32}, {"name": "hflip"}]
    set_transform(cmd, steps, on_decode_error="skip")
    ds = open_dataset("imgs", str(image_dir))
    transformer = Transformer(workers=2)
    try:
        plan = transformer.plan(ds.schema, cmd)
        assert plan is not None
        rows = np.arange(ds.num_rows, dtype=np.int64)
        got = sum(b.num_rows for b in transformer.message(ds, plan, rows, ["image", "label"], KEY, 8))
    finally:
        transformer.close()
        ds.close()
    shards = sorted(image_dir.glob("*.arrow"))
    blobs = [b for f in shards for b in pa.ipc.open_file(str(f)).read_all()["image"].to_pylist()]
    jpegs = [b for b in blobs if native.jpeg_size(b) is not None]
    assert len(jpegs) >= len(blobs) - len(blobs) // 7 - len(CORRUPT)  # all but the PNGs (and a cut header)
    assert got == len(blobs) - len(CORRUPT)
    assert len(calls) == len(jpegs)  # a truncated JPEG whose header parses tries natively, then fails on Pillow too


def test_without_the_native_extras_everything_takes_the_pillow_path(
    photos: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where simplejpeg / opencv-python-headless are not installed (``native.AVAILABLE`` false), a
    ``backend="native"`` request decodes exactly as ``backend="pillow"`` does."""
    view = memoryview(pa.py_buffer(photos[1]))
    monkeypatch.setattr(native, "AVAILABLE", False)
    frame = Frame.open(view, "RGB")
    assert not frame.native and native.jpeg_size(view) is None
    for steps in (TRAIN, VAL):
        for row in range(3):
            assert np.array_equal(
                run_row(view, steps_of(steps, "native"), KEY, row), run_row(view, steps_of(steps, "pillow"), KEY, row)
            )


def test_the_decode_pool_hands_out_one_encoded_image_per_task(
    image_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each task of the decode pool is one encoded image: with several per task, the message
    waited for one thread finishing its last few images alone (the old code gave each task 4 of a
    32-row message on 2 threads). The rows come out the same either way."""
    cmd = ReadCommand(version=WIRE_VERSION, dataset="imgs", world_size=1, batch_rows=32, streams=1, num_workers=1)
    steps: list[dict[str, Any]] = [{"name": "decode"}, {"name": "random_resized_crop", "size": 32}, {"name": "hflip"}]
    set_transform(cmd, steps, on_decode_error="skip")
    ds = open_dataset("imgs", str(image_dir))
    single, pooled = Transformer(workers=1), Transformer(workers=2)
    tasks: list[int] = []
    pool: Any = pooled._pool
    real_map = pool.map

    def recording_map(fn: Any, slices: list[tuple[int, int]]) -> Any:
        tasks.extend(hi - lo for lo, hi in slices)
        return real_map(fn, slices)

    monkeypatch.setattr(pool, "map", recording_map)
    try:
        plan = pooled.plan(ds.schema, cmd)
        assert plan is not None
        rows = np.arange(min(32, ds.num_rows), dtype=np.int64)
        got = pa.Table.from_batches(list(pooled.message(ds, plan, rows, ["image", "label"], KEY, 32)))
        want = pa.Table.from_batches(list(single.message(ds, plan, rows, ["image", "label"], KEY, 32)))
    finally:
        pooled.close()
        single.close()
        ds.close()
    assert tasks and set(tasks) == {1} and len(tasks) == len(rows)
    assert got.equals(want)
