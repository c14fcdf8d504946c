"""Image folders for ``flightfeed convert``: ``ROOT/CLASS/*.jpg|png`` -> rows of (image, label).

Classes are the sorted subfolder names; ``label`` is the class index (int64), and the class
names are kept in the schema metadata (``flightfeed.classes``, a JSON list). ``image`` holds the
encoded file bytes (binary), or with ``decode`` and ``size`` a uint8 tensor H x W x 3 (RGB,
resized with bilinear filtering). Decoding runs on a thread pool (Pillow releases the GIL).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.readers.ndarray import column_from_ndarray
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["ImageFolderSource", "IMAGE_SUFFIXES", "looks_like_image_folder"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def looks_like_image_folder(src: str) -> bool:
    return os.path.isdir(src) and any(f.lower().endswith(IMAGE_SUFFIXES) for _, _, names in os.walk(src) for f in names)


class ImageFolderSource:
    def __init__(self, root: str, *, decode: bool = False, size: tuple[int, int] | None = None) -> None:
        if decode and size is None:
            raise ConfigError("--decode needs --resize WxH (decoded images become fixed-shape tensors)")
        if size is not None and not decode:
            raise ConfigError("--resize needs --decode (encoded images are stored as they are)")
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
        items: list[tuple[str, int]] = []
        for label, name in enumerate(classes):
            for base, dirs, names in os.walk(os.path.join(root, name)):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                items.extend(
                    (os.path.join(base, n), label) for n in sorted(names) if n.lower().endswith(IMAGE_SUFFIXES)
                )
        if not items:
            raise DatasetError(
                f"{root}: no images in class subfolders (expected {root}/CLASS/*.jpg|*.png); "
                "each subfolder is one class"
            )
        self.classes = classes
        self.description = f"image folder ({len(classes)} classes)"
        self._items = sorted(items, key=lambda item: (item[1], item[0]))
        self._decode = decode
        self._size = size
        metadata: dict[bytes | str, bytes | str] = {
            "flightfeed.classes": json.dumps(classes),
            "flightfeed.source": "image-folder",
        }
        if size is not None:
            width, height = size
            image_type: pa.DataType = pa.fixed_shape_tensor(pa.uint8(), [height, width, 3])
            metadata["flightfeed.image_layout"] = "HWC-RGB-uint8"
        else:
            image_type = pa.binary()
            metadata["flightfeed.image_layout"] = "encoded"
        self._image_type = image_type
        self.schema = pa.schema([pa.field("image", image_type), pa.field("label", pa.int64())], metadata)
        self.num_rows = len(self._items)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="decode")

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, self.num_rows, rows):
            part = self._items[start : start + rows]
            labels = pa.array([label for _, label in part], type=pa.int64())
            if self._decode:
                pixels = np.stack(list(self._pool.map(self._load_pixels, [p for p, _ in part])))
                image = column_from_ndarray(pixels, self._image_type)
            else:
                image = pa.array(list(self._pool.map(_read_bytes, [p for p, _ in part])), type=pa.binary())
            yield pa.RecordBatch.from_arrays([image, labels], schema=self.schema)

    def _load_pixels(self, path: str) -> npt.NDArray[Any]:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize(self._size or img.size, Image.Resampling.BILINEAR)
                return np.asarray(rgb, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, ValueError) as exc:
            raise DatasetError(f"cannot decode image {path}: {exc}") from None

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
