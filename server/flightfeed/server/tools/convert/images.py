"""Image folders for ``flightfeed convert``: ``ROOT/CLASS/*.jpg|png`` -> rows of (image, label).

Classes are the sorted subfolder names; ``label`` is the class index (int64), and the class
names are kept in the schema metadata (``flightfeed.classes``, a JSON list). ``image`` holds the
encoded file bytes (binary), or with ``decode`` and ``size`` a uint8 tensor H x W x 3 (RGB,
resized with bilinear filtering). Decoding runs on a thread pool (Pillow releases the GIL).

Every file is decoded once here (``image_check``): one that does not decode is refused, naming it
(``on_bad_image="error"``), or left out and counted (``"skip"``: ``skipped`` lists them). An
empty class folder is an error, as in torchvision's ``ImageFolder``. ``max_side`` re-encodes
images whose longer side exceeds it (stored images only).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.readers.ndarray import column_from_ndarray
from flightfeed.server.tools.convert.image_check import BadImage, checked_bytes
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["ImageFolderSource", "IMAGE_SUFFIXES", "looks_like_image_folder"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
BAD_IMAGE_POLICIES = ("error", "skip")
_log = logging.getLogger(__name__)


def looks_like_image_folder(src: str) -> bool:
    return os.path.isdir(src) and any(f.lower().endswith(IMAGE_SUFFIXES) for _, _, names in os.walk(src) for f in names)


class ImageFolderSource:
    def __init__(
        self,
        root: str,
        *,
        decode: bool = False,
        size: tuple[int, int] | None = None,
        max_side: int | None = None,
        on_bad_image: str = "error",
    ) -> None:
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ConfigError(f"--on-bad-image {on_bad_image!r}: use 'error' or 'skip'")
        if max_side is not None and (decode or max_side < 1):
            raise ConfigError(
                f"--max-side {max_side}: give a positive side for stored (encoded) images; with --decode, "
                "--resize sets the size"
            )
        if decode and size is None:
            raise ConfigError("--decode needs --resize WxH (decoded images become fixed-shape tensors)")
        if size is not None and not decode:
            raise ConfigError("--resize needs --decode (encoded images are stored as they are)")
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
        items: list[tuple[str, int]] = []
        empty: list[str] = []
        for label, name in enumerate(classes):
            found = len(items)
            for base, dirs, names in os.walk(os.path.join(root, name)):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                items.extend(
                    (os.path.join(base, n), label) for n in sorted(names) if n.lower().endswith(IMAGE_SUFFIXES)
                )
            if len(items) == found:
                empty.append(name)
        if items and empty:
            raise DatasetError(
                f"{root}: class folder(s) without images: {empty} (extensions {list(IMAGE_SUFFIXES)}); every class "
                "needs at least one image (torchvision's ImageFolder refuses this too): add images or remove the folder"
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
        self._max_side = max_side
        self._on_bad = on_bad_image
        self.skipped: dict[str, str] = {}  # path -> why it did not decode (on_bad_image="skip")
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
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="decode")

    @property
    def num_rows(self) -> int:
        """Rows written: the images found less those skipped so far (final once batches are done)."""
        return len(self._items) - len(self.skipped)

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, len(self._items), rows):
            part = self._items[start : start + rows]
            load = self._load_pixels if self._decode else self._load_bytes
            loaded: list[Any] = list(self._pool.map(load, [p for p, _ in part]))
            keep = [k for k, v in enumerate(loaded) if not self._bad(v)]
            if not keep:
                continue
            labels = pa.array([part[k][1] for k in keep], type=pa.int64())
            if self._decode:
                image = column_from_ndarray(np.stack([loaded[k] for k in keep]), self._image_type)
            else:
                image = pa.array([loaded[k] for k in keep], type=pa.binary())
            yield pa.RecordBatch.from_arrays([image, labels], schema=self.schema)

    def _bad(self, value: Any) -> bool:
        if not isinstance(value, BadImage):
            return False
        if self._on_bad == "error":
            raise DatasetError(
                f"image {value.path} does not decode ({value.reason}); fix or remove the file, or convert with "
                "--on-bad-image skip to leave such files out (counted)"
            )
        if value.path not in self.skipped:
            self.skipped[value.path] = value.reason
            _log.warning("skipping image %s: it does not decode (%s)", value.path, value.reason)
        return True

    def _load_bytes(self, path: str) -> bytes | BadImage:
        return checked_bytes(path, self._max_side)

    def _load_pixels(self, path: str) -> npt.NDArray[Any] | BadImage:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize(self._size or img.size, Image.Resampling.BILINEAR)
                return np.asarray(rgb, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
            return BadImage(path, f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
