"""Local shards: a directory (searched recursively; a Hugging Face ``save_to_disk`` folder: the data
files its ``state.json`` lists), a glob, or one file."""

from __future__ import annotations

import glob
import os

from flightfeed.server.readers import ARROW_SUFFIXES, HDF5_SUFFIXES, format_of
from flightfeed.server.storage.hf_folder import DATASET_DICT, INFO, STATE, data_file_names, dataset_dict_error
from flightfeed.wire.errors import DatasetError

__all__ = ["list_local_shards", "SHARD_SUFFIXES"]

SHARD_SUFFIXES = (*ARROW_SUFFIXES, *HDF5_SUFFIXES, ".parquet")


def list_local_shards(uri: str) -> list[str]:
    """Shard files under ``uri`` sorted by path; one format only (else a clear error). A directory
    is walked with ``scandir`` and file types from the directory entries: no ``stat`` per file
    (the start-up of 100,000 shards reads their sizes where it opens them anyway)."""
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    if any(ch in path for ch in "*?["):
        files = [f for f in glob.glob(path, recursive=True) if f.lower().endswith(SHARD_SUFFIXES) and os.path.isfile(f)]
    elif os.path.isdir(path):
        listed = _hf_data_files(path)
        files = listed if listed is not None else []
        if listed is None:
            _walk(path, files)
    elif os.path.isfile(path):
        files = [path] if path.lower().endswith(SHARD_SUFFIXES) else []
    else:
        raise DatasetError(f"{uri}: no such file or directory")
    if not files:
        raise DatasetError(
            f"{uri}: no shard files found (looked for {', '.join(SHARD_SUFFIXES)}); "
            "convert other formats with `flightfeed convert`"
        )
    files.sort()
    formats = {format_of(f"x{suffix}") for suffix in {os.path.splitext(f)[1].lower() for f in files}}
    if len(formats) > 1:
        raise DatasetError(f"{uri}: mixes shard formats {sorted(formats)}; a dataset holds one format")
    return files


def _hf_data_files(folder: str) -> list[str] | None:
    """The data files of a Hugging Face ``save_to_disk`` folder (``hf_folder``); None for any other."""
    splits_path = os.path.join(folder, DATASET_DICT)
    if os.path.isfile(splits_path):
        with open(splits_path, "rb") as f:
            raise dataset_dict_error(folder, f.read(), os.sep)
    state_path = os.path.join(folder, STATE)
    if not (os.path.isfile(state_path) and os.path.isfile(os.path.join(folder, INFO))):
        return None
    with open(state_path, "rb") as f:
        files = [os.path.join(folder, name) for name in data_file_names(state_path, f.read())]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise DatasetError(
            f"{folder}: state.json lists {missing[0]}, which is missing ({len(missing)} of {len(files)} data "
            "file(s)); the save_to_disk folder is incomplete: save it again"
        )
    return files


def _walk(root: str, found: list[str]) -> None:
    """Files with a shard suffix under ``root``, hidden directories skipped (as ``os.walk`` did)."""
    pending = [root]
    while pending:
        top = pending.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):  # as os.walk: symlinked folders are not followed
                    if not entry.name.startswith("."):
                        pending.append(entry.path)
                elif entry.name.lower().endswith(SHARD_SUFFIXES) and entry.is_file():
                    found.append(entry.path)
            except OSError:
                continue  # vanished while listed
