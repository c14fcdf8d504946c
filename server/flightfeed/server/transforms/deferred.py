"""Decode on the trainer: the ``defer_decode`` step sends the encoded bytes plus each sample's
crop box and flip instead of pixels (docs/design.md §2: GPU decode, opt-in).

``defer_decode`` ends a column's steps (``[decode, random_resized_crop, hflip, defer_decode]``, or
a preset followed by it). The steps before it run exactly as on the server path, on a frame
opened from the header only, so the draws (keyed by the step's index) and hence the boxes are the
server path's, whatever the streams, workers or nodes. The column then keeps its encoded bytes
and two columns follow it:

* ``<column>_crop``: int32 ``[4]`` = (top, left, height, width) of the region of the *stored*
  image to resample, torchvision's ``resized_crop`` order (a box off whole pixels, e.g. of
  resize + center_crop, is rounded to them; it may reach outside the image: zero padding);
* ``<column>_flip``: bool, mirror left-right after the resample.

The output size and mode travel in the crop field's metadata (``flightfeed.size`` = [height,
width], ``flightfeed.mode``). The client (``flightfeed.client``'s trainer decode) decodes with
nvJPEG, crops, resizes and flips on the GPU. Undecodable bytes are found there, not here (only
headers are read): check image folders at convert time (``--on-bad-image``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.transforms.frame import Frame
from flightfeed.server.transforms.registry import Transform
from flightfeed.server.transforms.spec import ColumnSpec
from flightfeed.wire.transforms import DEFER_DECODE

__all__ = ["DEFER", "DEFER_STEP", "crop_name", "flip_name", "params_fields", "frame_params", "params_arrays"]

DEFER = DEFER_DECODE
SIZE_KEY = b"flightfeed.size"
MODE_KEY = b"flightfeed.mode"


def _defer_out(spec: ColumnSpec, p: Mapping[str, Any]) -> ColumnSpec:
    spec.need_image(DEFER)
    return spec


def _defer(f: Frame, p: Mapping[str, Any], rng: Any) -> Frame:
    return f


DEFER_STEP = Transform(
    DEFER,
    _defer,
    (),
    _defer_out,
    takes="frame",
    doc="last step: send the encoded bytes + <column>_crop (top, left, height, width) + <column>_flip; "
    "the trainer decodes (GPU)",
)


def crop_name(column: str) -> str:
    return f"{column}_crop"


def flip_name(column: str) -> str:
    return f"{column}_flip"


def params_fields(column: str, output: ColumnSpec) -> list[pa.Field[Any]]:
    """The two fields that follow a deferred column."""
    h, w, c = (int(d or 0) for d in output.shape)
    meta = {SIZE_KEY: json.dumps([h, w]).encode(), MODE_KEY: (b"L" if c == 1 else b"RGB")}
    return [
        pa.field(crop_name(column), pa.fixed_shape_tensor(pa.int32(), [4]), nullable=False, metadata=meta),
        pa.field(flip_name(column), pa.bool_(), nullable=False),
    ]


def frame_params(frame: Frame) -> tuple[tuple[int, int, int, int], bool]:
    """(top, left, height, width) of the frame's box in stored-image pixels, and its flip."""
    x0, y0, x1, y1 = frame.box
    left, top = round(x0), round(y0)
    return (top, left, max(1, round(y1) - top), max(1, round(x1) - left)), frame.flip


def params_arrays(
    crops: np.ndarray[Any, Any], flips: np.ndarray[Any, Any], field: pa.Field[Any]
) -> tuple[pa.Array[Any], pa.Array[Any]]:
    """The crop (int32 x 4 per row) and flip columns of a message."""
    storage = pa.FixedSizeListArray.from_arrays(pa.array(crops.reshape(-1).astype(np.int32)), 4)
    return pa.ExtensionArray.from_storage(field.type, storage), pa.array(flips.astype(bool), type=pa.bool_())
