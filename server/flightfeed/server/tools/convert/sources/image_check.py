"""One image file of an image folder at convert time: checked that it decodes, and re-encoded when
its longer side exceeds ``--max-side``.

* **Check** (always): the whole file is decoded (Pillow, at a 1/8 DCT scale for JPEGs where no
  re-encode is needed: every entropy-coded byte is still read, so truncation shows), so a ``.jpg``
  that is text, a truncated JPEG or any file Pillow cannot read is found here, by path, instead of
  failing a training run (``--on-bad-image error``, the default) or is left out and counted
  (``--on-bad-image skip``).
* **--max-side N** (FFCV's ``max_resolution``): an image whose longer side exceeds N is decoded,
  resized so that side is N (aspect ratio kept; Pillow's antialiased Lanczos after a DCT-domain
  reduce) and re-encoded (JPEG quality 90, PNG stays PNG). Smaller images keep their bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

__all__ = ["BadImage", "MAX_SIDE_QUALITY", "checked_bytes"]

MAX_SIDE_QUALITY = 90  # FFCV's default JPEG quality for re-encoded images


@dataclass(frozen=True)
class BadImage:
    """A file that does not decode: its path and what the decoder said."""

    path: str
    reason: str


def checked_bytes(path: str, max_side: int | None = None) -> bytes | BadImage:
    """The file's bytes (re-encoded if it exceeds ``max_side``), or a :class:`BadImage`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return BadImage(path, f"cannot read: {exc}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if max_side is not None and max(width, height) > max_side:
                return _reencoded(img, max_side)
            if img.format == "JPEG":
                img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))
            img.load()
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return BadImage(path, f"{type(exc).__name__}: {exc}")
    return data


def _reencoded(img: Image.Image, max_side: int) -> bytes:
    width, height = img.size
    scale = max_side / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    fmt = "PNG" if img.format == "PNG" else "JPEG"
    if fmt == "JPEG":
        img.draft("RGB", size)  # DCT-domain reduce to no less than the target, then filter
    out = img if img.mode in ("RGB", "L") or fmt == "PNG" else img.convert("RGB")
    small = out.resize(size, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    if fmt == "JPEG":
        small.save(buf, format="JPEG", quality=MAX_SIDE_QUALITY)
    else:
        small.save(buf, format="PNG")
    return buf.getvalue()
