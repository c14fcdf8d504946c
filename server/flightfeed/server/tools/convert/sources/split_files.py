"""Refuse a SRC folder whose files belong to several dataset splits.

Loaders' own tools write the splits of a dataset side by side: nanoGPT's ``prepare.py`` writes
``train.bin`` and ``val.bin`` into one folder, webdataset's ImageNet example
``shards/imagenet-train-000000.tar`` next to ``shards/imagenet-val-000000.tar``. Converting such a
folder as one dataset trains on the held-out split without a word. When SRC is a folder (not a
glob or brace pattern: those choose their files), the paths of the files found below it are split
into words, and files naming two or more split words (``train``, ``val``, ``test``, ...) stop the
conversion with the command that converts one split.
"""

from __future__ import annotations

import os
import re

from flightfeed.wire.errors import ConfigError

__all__ = ["SPLIT_WORDS", "refuse_mixed_splits"]

#: words in a file's path that name a dataset split
SPLIT_WORDS = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval"})
_WORD = re.compile(r"[a-z0-9]+")


def _split_of(path: str, root: str) -> str | None:
    rel = os.path.relpath(path, root) if not root.startswith("s3://") else path[len(root) :]
    words = set(_WORD.findall(rel.lower())) & SPLIT_WORDS
    return next(iter(words)) if len(words) == 1 else None


def refuse_mixed_splits(src: str, files: list[str], what: str, suggest: str) -> None:
    """Raise when the ``files`` found under the folder ``src`` name several splits. ``what``: the
    files' kind (for the message); ``suggest``: a SRC that converts one split, with ``{split}``
    and ``{first}`` (the first file of that split)."""
    if any(ch in src for ch in "*?[{") or (not src.startswith("s3://") and not os.path.isdir(src)):
        return
    root = src.rstrip("/") + "/" if src.startswith("s3://") else src
    by_split: dict[str, list[str]] = {}
    for path in files:
        split = _split_of(path, root)
        if split is not None:
            by_split.setdefault(split, []).append(path)
    if len(by_split) < 2:
        return
    split = sorted(by_split)[0] if "train" not in by_split else "train"
    shown = ", ".join(f"{s}: {len(paths)} file(s)" for s, paths in sorted(by_split.items()))
    first = by_split[split][0]
    folder = os.path.dirname(first)
    if split in _WORD.findall(os.path.relpath(folder, root).lower()):  # SRC/train/...: that folder
        one = folder
    else:
        one = suggest.format(split=split, first=first)
    raise ConfigError(
        f"{src} holds the {what} of several splits ({shown}); one dataset of them all would train on the "
        f"held-out data: convert each split on its own, e.g. `flightfeed convert {one} DST/{split} ...`"
    )
