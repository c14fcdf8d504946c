"""The sources other loaders left behind: ``--from webdataset|lmdb|tfrecord|mds|litdata|hf``.

``open_format_source`` opens one (local or ``s3://``); ``detect_format`` names the kind of a
source for ``--from auto`` when exactly one of these layouts is found (none: None; several: an error):

- ``lmdb``: a ``data.mdb`` (the directory holding it, or the file);
- ``hf``: a ``datasets`` ``save_to_disk`` folder (``state.json`` + ``dataset_info.json`` + ``.arrow``);
- ``mds`` / ``litdata``: an ``index.json`` of MosaicML Streaming (``shards`` of ``format: mds``) or
  of LitData (``chunks`` + ``config``);
- ``webdataset``: ``.tar``/``.tar.gz``/``.tgz`` shards; ``tfrecord``: ``.tfrecord``/``.tfrecords``/``.tfrec``.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.wire.errors import ConfigError

if TYPE_CHECKING:
    from flightfeed.server.tools.convert.sources.tabular import Source

__all__ = ["FORMAT_KINDS", "detect_format", "open_format_source"]

FORMAT_KINDS = ("webdataset", "lmdb", "tfrecord", "mds", "litdata", "hf")


def open_format_source(
    kind: str, src: str, storage: StorageOptions, *, on_bad_record: str = "error", lmdb_decoder: str = "msgpack"
) -> Source:
    files = SourceFiles(src, storage)
    policy = on_bad_record
    if kind == "webdataset":
        from flightfeed.server.tools.convert.sources.from_webdataset import WebDatasetSource

        return WebDatasetSource(src, files, policy)
    if kind == "lmdb":
        from flightfeed.server.tools.convert.sources.from_lmdb import LmdbSource

        return LmdbSource(src, files, policy, lmdb_decoder)
    if kind == "tfrecord":
        from flightfeed.server.tools.convert.sources.from_tfrecord import TFRecordSource

        return TFRecordSource(src, files, policy)
    if kind == "mds":
        from flightfeed.server.tools.convert.sources.from_mds import MdsSource

        return MdsSource(src, files, policy)
    if kind == "litdata":
        from flightfeed.server.tools.convert.sources.from_litdata import LitDataSource

        return LitDataSource(src, files, policy)
    if kind == "hf":
        from flightfeed.server.tools.convert.sources.from_hf import HfSource

        return HfSource(src, files, policy)
    raise ConfigError(f"--from {kind!r}: not one of {', '.join(FORMAT_KINDS)}")


def _index_kind(files: SourceFiles, path: str) -> str | None:
    try:
        with files.local(path) as local, open(local, "rb") as f:
            index: Any = json.loads(f.read(1 << 24))
    except (OSError, ValueError):
        return None
    shards = index.get("shards") if isinstance(index, dict) else None
    if isinstance(shards, list) and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards):
        return "mds"
    if isinstance(index, dict) and "chunks" in index and "config" in index:
        return "litdata"
    return None


def detect_format(src: str, storage: StorageOptions) -> str | None:
    """The one layout of ``FORMAT_KINDS`` found at ``src``, None for none; several are an error."""
    if not src.startswith("s3://") and not os.path.exists(src) and "{" not in src and not any(c in src for c in "*?["):
        return None
    files = SourceFiles(src, storage)
    try:
        paths = files.find(lambda p: True)
    except ConfigError:
        return None
    names = {p.rsplit("/", 1)[-1] for p in paths}
    kinds: set[str] = set()
    if "data.mdb" in names:
        kinds.add("lmdb")
    if {"state.json", "dataset_info.json"} <= names and any(p.endswith(".arrow") for p in paths):
        kinds.add("hf")
    for p in paths:
        low = p.lower()
        if p.rsplit("/", 1)[-1] == "index.json":
            kind = _index_kind(files, p)
            if kind is not None:
                kinds.add(kind)
        elif low.endswith((".tar", ".tar.gz", ".tgz")):
            kinds.add("webdataset")
        elif low.endswith((".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz")):
            kinds.add("tfrecord")
    if len(kinds) > 1:
        raise ConfigError(f"{src} holds several layouts ({', '.join(sorted(kinds))}); name the kind with --from")
    return kinds.pop() if kinds else None
