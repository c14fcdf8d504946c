"""An image on its way through a pipeline: a source image plus pending geometry.

Geometric steps (resize, crops, flips) do not touch pixels; they narrow a box of the source and
set the logical output size. :meth:`Frame.pixels` then decodes and resamples once: for a JPEG it
asks the decoder for a DCT-domain downscale (Pillow ``draft``: 1/2, 1/4 or 1/8) as far as the box
still covers the output size, and crops + resizes in one Pillow ``resize(box=...)`` pass. A
sample's result depends only on its bytes and the step parameters, never on the thread or order.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

__all__ = ["Frame", "RESAMPLE"]

RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


@dataclass
class Frame:
    """``src`` (opened, maybe not yet decoded); ``box`` = region of ``src`` in source pixels
    (x0, y0, x1, y1); ``size`` = logical (width, height); ``flip`` = mirrored left-right."""

    src: Image.Image
    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool = False
    resample: Image.Resampling = Image.Resampling.BILINEAR
    mode: str = "RGB"
    draft: bool = True

    @classmethod
    def open(cls, data: Any, mode: str, draft: bool = True) -> Frame:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        return cls(img, (0.0, 0.0, float(w), float(h)), (w, h), mode=mode, draft=draft)

    @classmethod
    def from_array(cls, arr: npt.NDArray[np.uint8]) -> Frame:
        img = Image.fromarray(arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
        w, h = img.size
        return cls(img, (0.0, 0.0, float(w), float(h)), (w, h), mode=img.mode, draft=False)

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    def resize(self, width: int, height: int, resample: Image.Resampling) -> None:
        self.size = (width, height)
        self.resample = resample

    def crop(self, left: int, top: int, width: int, height: int) -> None:
        """Crop logical pixels ``[left, left+width) x [top, top+height)``; the region may reach
        outside the image (zero padding, as Pillow's crop)."""
        x0, y0, x1, y1 = self.box
        sx = (x1 - x0) / self.size[0]
        sy = (y1 - y0) / self.size[1]
        ny0 = y0 + top * sy
        ny1 = y0 + (top + height) * sy
        if self.flip:  # logical x runs right to left in the source
            nx1 = x1 - left * sx
            nx0 = x1 - (left + width) * sx
        else:
            nx0 = x0 + left * sx
            nx1 = x0 + (left + width) * sx
        self.box = (nx0, ny0, nx1, ny1)
        self.size = (width, height)

    def mirror(self) -> None:
        self.flip = not self.flip

    def pixels(self) -> npt.NDArray[np.uint8]:
        """Decode and resample: uint8 (height, width, channels)."""
        img = self.src
        x0, y0, x1, y1 = self.box
        ow, oh = self.size
        if self.draft and img.format == "JPEG" and self.mode in ("RGB", "L"):
            full_w, full_h = img.size
            # the smallest decoded size whose box still covers the output size
            need = (
                max(1, math.ceil(full_w * ow / max(x1 - x0, 1e-9))),
                max(1, math.ceil(full_h * oh / max(y1 - y0, 1e-9))),
            )
            if need[0] < full_w and need[1] < full_h:
                img.draft(self.mode, need)
                fx, fy = img.size[0] / full_w, img.size[1] / full_h
                x0, x1, y0, y1 = x0 * fx, x1 * fx, y0 * fy, y1 * fy
        if img.mode != self.mode:
            img = img.convert(self.mode)
        inside = x0 >= 0 and y0 >= 0 and x1 <= img.size[0] + 1e-6 and y1 <= img.size[1] + 1e-6
        if not inside:  # a crop larger than the image: pad with zeros like Pillow/torchvision
            img = img.crop((math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1)))
            x1, y1 = x1 - math.floor(x0), y1 - math.floor(y0)
            x0, y0 = x0 - math.floor(x0), y0 - math.floor(y0)
        if (x0, y0, x1, y1) == (0, 0, img.size[0], img.size[1]) and (ow, oh) == img.size:
            out = img
        else:
            out = img.resize((ow, oh), self.resample, box=(x0, y0, x1, y1))
        if self.flip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(out)
        return arr if arr.ndim == 3 else arr[:, :, None]
