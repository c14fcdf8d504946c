"""The built-in transform steps: decode, resize, center_crop, random_resized_crop, hflip, to_chw
and cast. Geometry follows torchvision's definitions (shorter-side resize, centre crop rounding,
RandomResizedCrop's ten attempts then a centre fallback) so results match a Pillow reference
within resampling tolerance; draws come from the per-row generator (``rng.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flightfeed.server.transforms.frame import BACKENDS, RESAMPLE, Frame
from flightfeed.server.transforms.registry import Param, Transform
from flightfeed.server.transforms.spec import ColumnSpec
from flightfeed.wire.errors import InvalidRequest

__all__ = ["BUILTINS", "resized_shorter", "center_offsets", "rrc_params"]

_P = Mapping[str, Any]
_SIZE = Param("size", int, low=1, high=16384)
_INTERP = Param("interpolation", str, "bilinear", choices=tuple(RESAMPLE))
_DTYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


# -- decode ---------------------------------------------------------------------------------
def _decode_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    if spec.kind != "bytes":
        raise InvalidRequest(
            f"transform 'decode' needs an encoded-bytes column, but its input is {spec.describe()}",
            field="transform.decode",
        )
    return ColumnSpec("array", (None, None, 1 if p["mode"] == "L" else 3), "uint8", "HWC")


def _decode(data: Any, p: _P, rng: Any) -> Frame:
    return Frame.open(data, p["mode"], draft=p["draft"], backend=p["backend"])


# -- resize ---------------------------------------------------------------------------------
def resized_shorter(width: int, height: int, size: int) -> tuple[int, int]:
    """torchvision ``Resize(size)``: the shorter side becomes ``size``, the other keeps the ratio."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def _resize_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    h, w, c = spec.need_image("resize")
    if h is None or w is None:
        return spec.with_(shape=(None, None, c))
    nw, nh = resized_shorter(w, h, p["size"])
    return spec.with_(shape=(nh, nw, c))


def _resize(f: Frame, p: _P, rng: Any) -> Frame:
    f.resize(*resized_shorter(f.width, f.height, p["size"]), p["interpolation"])
    return f


# -- crops ----------------------------------------------------------------------------------
def _square_out(step: str) -> Callable[[ColumnSpec, _P], ColumnSpec]:
    def out(spec: ColumnSpec, p: _P) -> ColumnSpec:
        _, _, c = spec.need_image(step)
        return spec.with_(shape=(p["size"], p["size"], c))

    return out


def center_offsets(width: int, height: int, cw: int, ch: int) -> tuple[int, int]:
    """torchvision ``center_crop``'s (left, top)."""
    return round((width - cw) / 2.0), round((height - ch) / 2.0)


def _center_crop(f: Frame, p: _P, rng: Any) -> Frame:
    s = p["size"]
    left, top = center_offsets(f.width, f.height, s, s)
    f.crop(left, top, s, s)
    return f


def rrc_params(
    width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params`` -> (left, top, w, h), drawn from ``rng``."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _rrc_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    for name in ("scale", "ratio"):
        lo, hi = p[name]
        if not 0 < lo <= hi:
            raise InvalidRequest(
                f"transform 'random_resized_crop': parameter {name!r} is {list(p[name])}; allowed: "
                "[low, high] with 0 < low <= high",
                field=f"transform.random_resized_crop.{name}",
            )
    return _square_out("random_resized_crop")(spec, p)


def _rrc(f: Frame, p: _P, rng: np.random.Generator) -> Frame:
    left, top, w, h = rrc_params(f.width, f.height, p["scale"], p["ratio"], rng)
    f.crop(left, top, w, h)
    f.resize(p["size"], p["size"], p["interpolation"])
    return f


# -- flips, layout, dtype -------------------------------------------------------------------
def _hflip_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    spec.need_image("hflip")
    return spec


def _hflip(f: Frame, p: _P, rng: np.random.Generator) -> Frame:
    if rng.random() < p["p"]:
        f.mirror()
    return f


def _chw_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    h, w, c = spec.need_image("to_chw", dtype=None)
    return spec.with_(shape=(c, h, w), layout="CHW")


def _to_chw(x: np.ndarray[Any, Any], p: _P, rng: Any) -> np.ndarray[Any, Any]:
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def _cast_out(spec: ColumnSpec, p: _P) -> ColumnSpec:
    if spec.kind != "array":
        raise InvalidRequest("transform 'cast' needs an array input (put 'decode' first)", field="transform.cast")
    return spec.with_(dtype=p["dtype"])


def _cast(x: np.ndarray[Any, Any], p: _P, rng: Any) -> np.ndarray[Any, Any]:
    out = x.astype(p["dtype"])
    if p["scale"] != 1.0:
        out *= np.asarray(p["scale"], dtype=out.dtype)
    return out


BUILTINS = (
    Transform(
        "decode",
        _decode,
        (
            Param("mode", str, "RGB", choices=("RGB", "L")),
            Param("draft", bool, True),
            Param("backend", str, "native", choices=BACKENDS),
        ),
        _decode_out,
        takes="bytes",
        doc="JPEG/PNG/WebP bytes -> uint8 HWC (RGB or L); draft: DCT-domain downscale where the box allows; "
        "backend: 'native' (libjpeg-turbo + OpenCV, no GIL; Pillow where it does not apply) or 'pillow'",
    ),
    Transform("resize", _resize, (_SIZE, _INTERP), _resize_out, takes="frame", doc="shorter side -> size"),
    Transform("center_crop", _center_crop, (_SIZE,), _square_out("center_crop"), takes="frame"),
    Transform(
        "random_resized_crop",
        _rrc,
        (
            _SIZE,
            Param("scale", list, (0.08, 1.0), low=0.0, high=1.0, length=2),
            Param("ratio", list, (3 / 4, 4 / 3), low=1e-3, high=1e3, length=2),
            _INTERP,
        ),
        _rrc_out,
        random=True,
        takes="frame",
    ),
    Transform("hflip", _hflip, (Param("p", float, 0.5, low=0.0, high=1.0),), _hflip_out, random=True, takes="frame"),
    Transform("to_chw", _to_chw, (), _chw_out),
    Transform(
        "cast",
        _cast,
        (Param("dtype", str, choices=_DTYPES), Param("scale", float, 1.0)),
        _cast_out,
        doc="astype(dtype), then multiply by scale (e.g. 1/255)",
    ),
)
