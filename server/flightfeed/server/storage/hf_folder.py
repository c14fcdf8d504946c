"""Hugging Face ``save_to_disk`` folders served as they are (local or ``s3://``).

A ``Dataset.save_to_disk`` folder holds ``state.json`` (its data files, ``_data_files``),
``dataset_info.json`` and ``data-XXXXX-of-NNNNN.arrow``. The dataset is the files ``state.json``
lists, nothing else: ``load_from_disk(folder).map(...)`` (or ``filter``, ...) writes its results as
``cache-*.arrow`` into the same folder, which a listing of every ``.arrow`` file served too. A
``DatasetDict.save_to_disk`` folder (``dataset_dict.json`` and a folder per split) is refused:
serving it would mix its splits in one dataset.
"""

from __future__ import annotations

import json

from flightfeed.wire.errors import DatasetError

__all__ = ["STATE", "INFO", "DATASET_DICT", "dataset_dict_error", "data_file_names"]

STATE = "state.json"
INFO = "dataset_info.json"
DATASET_DICT = "dataset_dict.json"


def dataset_dict_error(folder: str, raw: bytes | None, sep: str = "/") -> DatasetError:
    """The refusal of the DatasetDict folder ``folder`` (``raw``: its dataset_dict.json)."""
    try:
        splits = [str(s) for s in json.loads(raw or b"{}").get("splits", [])]
    except (ValueError, AttributeError, TypeError):
        splits = []
    first = splits[0] if splits else "train"
    return DatasetError(
        f"{folder} is a datasets DatasetDict ({', '.join(splits) or 'several splits'}): serving the folder would "
        f"mix its splits in one dataset; serve each split, e.g. NAME={folder.rstrip(sep)}{sep}{first}"
    )


def data_file_names(state_path: str, raw: bytes) -> list[str]:
    """The data file names ``state.json`` (read from ``state_path``) lists, in its order."""
    try:
        listed = json.loads(raw).get("_data_files")
        return [str(entry["filename"]) for entry in listed]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DatasetError(
            f"{state_path}: not a readable datasets save_to_disk state ({exc}); re-save the dataset with "
            "save_to_disk, or convert it with `flightfeed convert --from hf`"
        ) from None
