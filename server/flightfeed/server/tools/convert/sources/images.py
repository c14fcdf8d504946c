"""Image folders for ``flightfeed convert``: ``ROOT/CLASS/*.jpg|png`` -> rows of (image, label).

Classes are the sorted subfolder names; ``label`` is the class index (int64), and the class
names are kept in the schema metadata (``flightfeed.classes``, a JSON list). ``source_path``
(string, unless ``--no-source-path``) is each image's path relative to the folder converted, so a
row can be traced back to its file. A folder whose subfolders are dataset splits (``train/``,
``val/``, ...: :func:`split_folders`) is not one dataset: ``convert`` refuses it here and the CLI
converts each split (``splits``). ``image`` holds the
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
from flightfeed.server.tools.convert.sources.image_check import BadImage, checked_bytes
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = [
    "ImageFolderSource", "IMAGE_SUFFIXES", "SOURCE_PATH", "SPLIT_NAMES", "looks_like_image_folder", "class_folders",
    "split_folders",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
BAD_IMAGE_POLICIES = ("error", "skip")
#: the column holding each image's path relative to the converted root (``--no-source-path``: none)
SOURCE_PATH = "source_path"
_log = logging.getLogger(__name__)


def looks_like_image_folder(src: str) -> bool:
    return os.path.isdir(src) and any(f.lower().endswith(IMAGE_SUFFIXES) for _, _, names in os.walk(src) for f in names)


#: folder names that mean a dataset split, not a class (case-insensitive)
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval"})


def split_folders(root: str) -> list[str]:
    """The split subfolders of ``root`` when it holds splits of class folders (``train/CLASS/*.jpg``,
    ``val/CLASS/*.jpg``): every subfolder is named like a split and holds class folders of images.
    [] for a plain image folder (a class named ``val`` whose images sit directly in it is a class)."""
    if not os.path.isdir(root):
        return []
    subs = class_folders(root)
    if not subs or any(name.lower() not in SPLIT_NAMES for name in subs):
        return []
    def holds_classes(split: str) -> bool:
        where = os.path.join(root, split)
        return any(looks_like_image_folder(os.path.join(where, c)) for c in class_folders(where))

    return subs if all(holds_classes(n) for n in subs) else []


def class_folders(root: str) -> list[str]:
    """The sorted non-hidden subfolders of ``root`` (an image folder's classes)."""
    return sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))


class ImageFolderSource:
    def __init__(
        self,
        root: str,
        *,
        decode: bool = False,
        size: tuple[int, int] | None = None,
        max_side: int | None = None,
        on_bad_image: str = "error",
        classes: list[str] | None = None,
        source_path: bool = True,
        base: str | None = None,
    ) -> None:
        """``classes``: the class list to label with (a split of a dataset: the union over its
        splits, so label ``i`` names one class in every split; default: ``root``'s subfolders).
        ``source_path``: add the ``source_path`` column, each image's path relative to ``base``
        (default ``root``), with ``/`` separators."""
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
        self._base = base if base is not None else root  # source_path is relative to it
        present = class_folders(root)
        if classes is None:
            classes = present
        items: list[tuple[str, int]] = []
        empty: list[str] = []
        for label, name in enumerate(classes):
            if name not in present:
                continue  # a class of another split
            found = len(items)
            for here, dirs, names in os.walk(os.path.join(root, name)):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                items.extend(
                    (os.path.join(here, n), label) for n in sorted(names) if n.lower().endswith(IMAGE_SUFFIXES)
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
        fields = [pa.field("image", image_type), pa.field("label", pa.int64())]
        self._source_path = source_path
        if source_path:
            fields.append(pa.field(SOURCE_PATH, pa.string()))
        self.schema = pa.schema(fields, metadata)
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
            arrays = [image, labels]
            if self._source_path:
                rel = [os.path.relpath(part[k][0], self._base).replace(os.sep, "/") for k in keep]
                arrays.append(pa.array(rel, type=pa.string()))
            yield pa.RecordBatch.from_arrays(arrays, schema=self.schema)

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
