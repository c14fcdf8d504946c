"""An image on its way through a pipeline: a source image plus pending geometry.

Geometric steps (resize, crops, flips) do not touch pixels; they narrow a box of the source and
set the logical output size. Opening a JPEG reads only its header. :meth:`Frame.render` then
decodes and resamples once, straight into the output slot: the native path (``native.py``:
libjpeg-turbo at the smallest DCT scale that covers the box, one OpenCV resample, no GIL), or
the Pillow path (PNG/WebP, CMYK JPEGs, ``lanczos``/``box`` resampling, ``backend="pillow"``, or
without the native extras): Pillow ``draft`` (1/2, 1/4, 1/8) as far as the box still covers the
output size, and crop + resize in one ``resize(box=...)`` pass. A sample's result depends only on
its bytes and the step parameters, never on the thread or order.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from flightfeed.server.transforms import native

__all__ = ["Frame", "RESAMPLE", "BACKENDS"]

#: ``decode``'s ``backend`` choices: "native" (where installed and applicable, else Pillow), "pillow"
BACKENDS = ("native", "pillow")

RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


@dataclass
class Frame:
    """``source``: encoded bytes (a JPEG for the native path) or a decoded HxWxC array; ``full`` =
    its (width, height); ``box`` = region of the source in source pixels (x0, y0, x1, y1);
    ``size`` = logical (width, height); ``flip`` = mirrored left-right."""

    source: Any
    full: tuple[int, int]
    box: tuple[float, float, float, float]
    size: tuple[int, int]
    flip: bool = False
    resample: str = "bilinear"
    mode: str = "RGB"
    draft: bool = True
    native: bool = False  # source is a JPEG (or array) the native path renders
    _image: Image.Image | None = None

    @classmethod
    def open(cls, data: Any, mode: str, draft: bool = True, backend: str = "native") -> Frame:
        """Only the header is read here (the native path's JPEGs: ~1 us; else Pillow's open)."""
        size = None
        if backend == "native" and native.AVAILABLE:
            data = native.unsigned(data)  # a pyarrow buffer's view is signed bytes: libjpeg wants unsigned
            size = native.jpeg_size(data)
        if size is not None:
            box = (0.0, 0.0, float(size[0]), float(size[1]))
            return cls(data, size, box, size, mode=mode, draft=draft, native=True)
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        return cls(data, (w, h), (0.0, 0.0, float(w), float(h)), (w, h), mode=mode, draft=draft, _image=img)

    @classmethod
    def from_array(cls, arr: npt.NDArray[np.uint8]) -> Frame:
        h, w = int(arr.shape[0]), int(arr.shape[1])
        channels = arr.shape[2] if arr.ndim == 3 else 1
        fast = native.AVAILABLE and channels in (1, 3) and arr.dtype == np.uint8
        mode = "L" if channels == 1 else "RGB" if channels == 3 else "RGBA"
        return cls(arr, (w, h), (0.0, 0.0, float(w), float(h)), (w, h), mode=mode, draft=False, native=fast)

    @property
    def src(self) -> Image.Image:
        """The source as a Pillow image (opened on first use)."""
        if self._image is None:
            arr = self.source
            if isinstance(arr, np.ndarray):
                self._image = Image.fromarray(arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr)
            else:
                self._image = Image.open(io.BytesIO(arr))
        return self._image

    @property
    def width(self) -> int:
        return self.size[0]

    @property
    def height(self) -> int:
        return self.size[1]

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3 if self.mode == "RGB" else len(self.mode)

    def resize(self, width: int, height: int, resample: str) -> None:
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
        out = np.empty((self.size[1], self.size[0], self.channels), dtype=np.uint8)
        self.render(out)
        return out

    def render(self, out: npt.NDArray[np.uint8]) -> None:
        """Decode and resample into ``out`` (height, width, channels), e.g. a message's row slot."""
        if self.native and self.resample in native.INTERPOLATION:
            try:
                native.render(
                    self.source, self.full, self.box, out, flip=self.flip, interpolation=self.resample, draft=self.draft
                )
                return
            except ValueError:
                if isinstance(self.source, np.ndarray):
                    raise
                # libjpeg-turbo refused it: Pillow decides (and names the error if it fails too)
        arr = self._pillow_pixels()
        if arr.shape != out.shape:
            raise ValueError(f"the image has {arr.shape[2]} channel(s) in mode {self.mode!r}; the plan: {out.shape}")
        out[...] = arr

    def _pillow_pixels(self) -> npt.NDArray[np.uint8]:
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
            out = img.resize((ow, oh), RESAMPLE[self.resample], box=(x0, y0, x1, y1))
        if self.flip:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(out)
        return arr if arr.ndim == 3 else arr[:, :, None]
