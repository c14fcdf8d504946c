"""Small real JPEG/PNG datasets for the transform tests (deterministic content)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from PIL import Image

_FIELDS: list[pa.Field[Any]] = [
    pa.field("image", pa.binary()),
    pa.field("label", pa.int64()),
    pa.field("index", pa.int64()),
]
SCHEMA = pa.schema(_FIELDS)


def picture(index: int, width: int, height: int) -> np.ndarray:
    """A smooth, asymmetric picture (gradients + a block), so crops and flips are visible."""
    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(1, width - 1)).astype(np.uint8)
    g = (y * 255 // max(1, height - 1)).astype(np.uint8)
    b = np.full_like(r, (index * 37) % 256)
    img = np.stack([r, g, b], axis=-1)
    img[: height // 3, : width // 4] = (250, 20, 20)
    return img


def encode(pixels: np.ndarray, fmt: str = "JPEG", quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return out.getvalue()


def sizes(n: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(40, 96)), int(rng.integers(36, 90))) for _ in range(n)]


def write_images(
    root: Path, shard_rows: Sequence[int], *, corrupt: Sequence[int] = (), png_every: int = 0, batch: int = 16
) -> list[bytes]:
    """Shards of (image bytes, label, index); rows in ``corrupt`` hold a truncated JPEG.
    Returns every row's bytes."""
    root.mkdir(parents=True, exist_ok=True)
    total = sum(shard_rows)
    dims = sizes(total)
    blobs: list[bytes] = []
    for i, (w, h) in enumerate(dims):
        fmt = "PNG" if png_every and i % png_every == png_every - 1 else "JPEG"
        data = encode(picture(i, w, h), fmt)
        blobs.append(data[: len(data) // 3] if i in corrupt else data)
    row = 0
    for s, n in enumerate(shard_rows):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), SCHEMA) as writer:
            for lo in range(row, row + n, batch):
                hi = min(row + n, lo + batch)
                writer.write_batch(
                    pa.record_batch(
                        [
                            pa.array(blobs[lo:hi], type=pa.binary()),
                            pa.array([i % 5 for i in range(lo, hi)], type=pa.int64()),
                            pa.array(list(range(lo, hi)), type=pa.int64()),
                        ],
                        schema=SCHEMA,
                    )
                )
        row += n
    return blobs
