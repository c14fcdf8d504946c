"""A folder of dataset splits (``ROOT/train/CLASS/*.jpg``, ``ROOT/val/CLASS/*.jpg``): one dataset per split.

Converting such a root as one image folder would make a dataset whose classes are the splits
(``train``, ``val``), silently. :func:`convert_splits` converts each split into ``DST/<split>``
instead, labelling every split with the sorted union of the splits' class names, so label ``i``
names the same class in each (a class that a split lacks simply has no rows there), and
``source_path`` stays relative to ``ROOT`` (``train/cat/1.jpg``). Serve them as
``flightfeed serve train=DST/train val=DST/val``.
"""

from __future__ import annotations

import os
from dataclasses import replace

from flightfeed.server.storage.manifest import Manifest
from flightfeed.server.tools.convert.pipeline import ConvertSettings, convert
from flightfeed.server.tools.convert.sources.images import class_folders, split_folders

__all__ = ["convert_splits", "split_folders", "split_destination"]


def split_destination(dst: str, split: str) -> str:
    """Where split ``split`` of a conversion into ``dst`` goes (a local path or an s3:// prefix)."""
    return f"{dst.rstrip('/')}/{split}" if "://" in dst else os.path.join(dst, split)


def convert_splits(src: str, dst: str, settings: ConvertSettings | None = None) -> dict[str, Manifest]:
    """Convert each split folder of ``src`` into ``DST/<split>``; the manifests by split name."""
    settings = settings or ConvertSettings()
    splits = split_folders(src)
    classes = sorted({c for split in splits for c in class_folders(os.path.join(src, split))})
    per_split = replace(settings, kind="images", classes=classes, source_base=src)
    return {split: convert(os.path.join(src, split), split_destination(dst, split), per_split) for split in splits}
