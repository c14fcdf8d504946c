"""The native image path: JPEG decode at a DCT scale, then one SIMD resample into the output slot.

Both calls release the GIL, so a message's rows decode in parallel on the decode pool's threads
(the Python around them is a few tens of microseconds per row):

* **decode**: ``simplejpeg`` (libjpeg-turbo, bundled in its wheel). The box a sample needs is
  known before any pixel is decoded (the geometry steps only narrow a box, ``frame.py``), so the
  image is decoded at the smallest power-of-two DCT scale (1/2, 1/4, 1/8) that still gives at
  least the output resolution over that box. Only power-of-two scales: libjpeg-turbo's other
  M/8 scales use non-SIMD IDCTs and measured slower than a full decode. Every row is
  entropy-decoded: libjpeg-turbo's crop-aware decode (``jpeg_skip_scanlines`` above the box, stop
  after its last row, ``jpeg_crop_scanline`` for its columns) is exposed by no maintained binding
  (simplejpeg, PyTurboJPEG 1.x/2.x, OpenCV, Pillow, imagecodecs); PyTurboJPEG's ``crop`` is a
  lossless transform that re-encodes the box, and crop + decode measured 1.5x *slower* than a full
  decode. Through the C API it would save ~22% of the decode (``bench/experiments/bench_crop_decode.py``);
* **resample**: OpenCV ``resize`` (bilinear/bicubic/nearest; ``INTER_AREA`` where the box is still
  at least twice the output after the DCT scale) for boxes on whole pixels; a box that is a
  whole-pixel window of the image resized as a whole (``resize`` + ``center_crop``) is made exactly
  so (resize, then copy the window); any other box goes through ``warpAffine`` with the exact
  sub-pixel box (and zero padding). The flip is done in place afterwards.

Pixels differ from the Pillow path (full decode + Pillow's antialiased resample) within the
tolerance that ``tests/transforms/test_native_decode.py`` checks (mean absolute difference of a
few grey levels: OpenCV's bilinear does not low-pass a downscale of less than 2x). ``lanczos``
and ``box`` resampling, non-JPEG inputs and JPEGs libjpeg-turbo cannot convert (CMYK) take the
Pillow path. Without ``simplejpeg``/``opencv-python-headless`` installed (the ``server`` and
``images`` extras), everything takes the Pillow path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

try:  # the `server` / `images` extras; the Pillow path works without them
    import cv2
    import simplejpeg
except ImportError:  # pragma: no cover - exercised where the extras are missing
    cv2 = None  # type: ignore[assignment]
    simplejpeg = None

__all__ = ["AVAILABLE", "unsigned", "jpeg_size", "single_threaded", "decode_scale", "render"]

AVAILABLE = cv2 is not None and simplejpeg is not None
_U8 = npt.NDArray[np.uint8]
#: Pillow resample name -> OpenCV interpolation (the names the native resampler takes)
INTERPOLATION: dict[str, int] = (
    {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC} if AVAILABLE else {}
)
_EPS = 1e-6


def single_threaded() -> None:
    """OpenCV's own thread pool off: the decode pool already runs one image per thread."""
    if AVAILABLE:
        cv2.setNumThreads(1)


def unsigned(data: Any) -> Any:
    """Encoded bytes as a buffer of *unsigned* bytes. A pyarrow ``Buffer``'s memoryview has format
    ``'b'`` (signed char): its first byte reads as -1, not 0xFF, and libjpeg bindings refuse it."""
    if isinstance(data, bytes | bytearray):
        return data
    view = memoryview(data)
    return view if view.format == "B" else view.cast("B")


def jpeg_size(data: Any) -> tuple[int, int] | None:
    """(width, height) of a JPEG that the native path decodes to RGB/L, else None (Pillow's turn)."""
    if not AVAILABLE or len(data) < 4:
        return None
    data = unsigned(data)
    if data[0] != 0xFF or data[1] != 0xD8:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("Gray", "YCbCr", "RGB"):  # CMYK/YCCK: libjpeg-turbo will not make RGB of it
        return None
    return int(width), int(height)


def decode_scale(full: tuple[int, int], box: tuple[float, float, float, float], out: tuple[int, int]) -> int:
    """The DCT downscale (1, 2, 4 or 8) whose decoded box still covers ``out`` pixels."""
    w, h = full
    bw, bh = max(box[2] - box[0], _EPS), max(box[3] - box[1], _EPS)
    for k in (8, 4, 2):
        if math.ceil(w / k) * bw / w >= out[0] and math.ceil(h / k) * bh / h >= out[1]:
            return k
    return 1


def _decode(data: Any, full: tuple[int, int], k: int, gray: bool) -> _U8:
    colorspace = "GRAY" if gray else "RGB"
    if k == 1:
        img: _U8 = simplejpeg.decode_jpeg(data, colorspace=colorspace)
    else:
        img = simplejpeg.decode_jpeg(
            data, colorspace=colorspace, min_width=math.ceil(full[0] / k), min_height=math.ceil(full[1] / k)
        )
    return img


def render(
    source: Any,
    full: tuple[int, int],
    box: tuple[float, float, float, float],
    dst: _U8,
    *,
    flip: bool,
    interpolation: str,
    draft: bool,
) -> None:
    """Write the ``box`` of ``source`` (JPEG bytes, or a decoded HxWxC uint8 array), resampled to
    ``dst``'s size and mirrored if ``flip``, into ``dst`` (oh, ow, channels). Raises on bad bytes."""
    oh, ow, channels = dst.shape
    if isinstance(source, np.ndarray):
        img, fx, fy = source, 1.0, 1.0
    else:
        k = decode_scale(full, box, (ow, oh)) if draft else 1
        img = _decode(source, full, k, gray=channels == 1)
        fx, fy = img.shape[1] / full[0], img.shape[0] / full[1]
    x0, y0, x1, y1 = box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy
    target = dst[:, :, 0] if channels == 1 else dst
    src = img[:, :, 0] if channels == 1 and img.ndim == 3 else img
    _resample(src, (x0, y0, x1, y1), target, INTERPOLATION[interpolation])
    if flip:
        _store(cv2.flip(target, 1, dst=target), target)


def _whole(v: float, eps: float = _EPS) -> bool:
    return abs(v - round(v)) < eps


def _resample(img: _U8, box: tuple[float, float, float, float], dst: _U8, interp: int) -> None:
    oh, ow = dst.shape[:2]
    x0, y0, x1, y1 = box
    h, w = img.shape[:2]
    inside = x0 > -_EPS and y0 > -_EPS and x1 < w + _EPS and y1 < h + _EPS
    whole = all(_whole(v) for v in box)
    if whole and round(x1 - x0) == ow and round(y1 - y0) == oh:  # a plain crop: copy (zero padding outside)
        _copy_crop(img, round(x0), round(y0), dst)
        return
    if inside and whole:
        crop = img[round(y0) : round(y1), round(x0) : round(x1)]
        if interp == cv2.INTER_LINEAR and (x1 - x0) >= 2 * ow and (y1 - y0) >= 2 * oh:
            interp = cv2.INTER_AREA  # a large downscale: average, as Pillow's antialiased filter does
        _store(cv2.resize(crop, (ow, oh), dst=dst, interpolation=interp), dst)
        return
    sx, sy = (x1 - x0) / ow, (y1 - y0) / oh
    rw, rh, ox, oy = w / sx, h / sy, x0 / sx, y0 / sy
    if inside and all(_whole(v, 1e-6 * (w + h)) for v in (rw, rh, ox, oy)):
        # the box is a whole-pixel window of the image resized as a whole (Resize + CenterCrop):
        # resize it so, exactly as torchvision defines it, and copy the window
        if interp == cv2.INTER_LINEAR and sx >= 2 and sy >= 2:
            interp = cv2.INTER_AREA
        resized: _U8 = np.asarray(cv2.resize(img, (round(rw), round(rh)), interpolation=interp))
        _copy_crop(resized, round(ox), round(oy), dst)
        return
    if sx >= 2 and sy >= 2:  # pre-reduce by whole factors with averaging, then the exact warp
        fx, fy = int(sx), int(sy)
        img = np.asarray(cv2.resize(img, (max(1, w // fx), max(1, h // fy)), interpolation=cv2.INTER_AREA))
        gx, gy = img.shape[1] / w, img.shape[0] / h
        x0, y0, sx, sy = x0 * gx, y0 * gy, sx * gx, sy * gy
    # dst pixel centre (i + 0.5) maps to source x0 + (i + 0.5) * sx (Pillow's and OpenCV's convention)
    matrix = np.array([[sx, 0.0, x0 + 0.5 * sx - 0.5], [0.0, sy, y0 + 0.5 * sy - 0.5]])
    out = cv2.warpAffine(
        img, matrix, (ow, oh), dst=dst, flags=interp | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT, borderValue=0,
    )
    _store(out, dst)


def _copy_crop(img: _U8, left: int, top: int, dst: _U8) -> None:
    oh, ow = dst.shape[:2]
    h, w = img.shape[:2]
    ax0, ay0 = max(0, left), max(0, top)
    ax1, ay1 = min(w, left + ow), min(h, top + oh)
    if ax0 >= ax1 or ay0 >= ay1:
        dst[...] = 0
        return
    if (ax0, ay0, ax1, ay1) != (left, top, left + ow, top + oh):
        dst[...] = 0
    dst[ay0 - top : ay1 - top, ax0 - left : ax1 - left] = img[ay0:ay1, ax0:ax1]


def _store(result: Any, dst: _U8) -> None:
    """OpenCV writes into ``dst`` when it fits; should it ever allocate instead, copy."""
    if result is not dst and not np.shares_memory(result, dst):
        dst[...] = np.asarray(result).reshape(dst.shape)
