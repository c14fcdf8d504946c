"""The files of a ``--from webdataset|lmdb|tfrecord|mds|litdata|hf`` source, local or on S3.

``SRC`` is a file, a directory (searched recursively, hidden entries skipped), a glob, or a
brace pattern (``train-{000000..000146}.tar``, ``{train,val}.tfrecord``); any of these may be an
``s3://bucket/prefix`` URI. An S3 object is read through a local copy made when it is opened
(one whole-object download with sized reads, :func:`storage.s3_client.download`) and deleted
when it is closed, so every reader works on plain local files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.tools.convert.sources.tabular import find_files
from flightfeed.wire.errors import ConfigError, StorageError

__all__ = ["SourceFiles", "expand_braces"]

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """``a-{00..02}.tar`` -> ``a-00.tar a-01.tar a-02.tar`` (zero padding kept); ``{x,y}`` lists."""
    match = _RANGE.search(pattern)
    if match is not None:
        lo, hi = match.group(1), match.group(2)
        if int(hi) < int(lo):
            raise ConfigError(f"{pattern}: brace range {{{lo}..{hi}}} runs backwards")
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        head, tail = pattern[: match.start()], pattern[match.end() :]
        return [p for n in range(int(lo), int(hi) + 1) for p in expand_braces(f"{head}{n:0{width}d}{tail}")]
    match = _LIST.search(pattern)
    if match is not None:
        head, tail = pattern[: match.start()], pattern[match.end() :]
        return [p for item in match.group(1).split(",") for p in expand_braces(head + item + tail)]
    return [pattern]


class SourceFiles:
    """Lists and opens the files of ``src`` (local or ``s3://``)."""

    def __init__(self, src: str, storage: StorageOptions) -> None:
        self.src = src
        self.remote = src.startswith("s3://")
        self._storage = storage
        self._fs = None
        if self.remote:
            from flightfeed.server.storage.s3 import filesystem_for

            self._fs = filesystem_for(storage)

    def find(self, accept: Callable[[str], bool]) -> list[str]:
        """Files of the source whose path ``accept``\\ s, sorted by path (brace patterns keep their
        order). A brace pattern naming a file that does not exist is an error."""
        if "{" in self.src:
            named = expand_braces(self.src)
            missing = [p for p in named if not self.exists(p)]
            if missing:
                raise ConfigError(f"{self.src}: {len(missing)} file(s) of the pattern do not exist, first {missing[0]}")
            return named
        if not self.remote:
            return [f for f in find_files(self.src, ("",)) if accept(f)]
        return sorted(p for p in self._list_remote(self.src) if accept(p))

    def exists(self, path: str) -> bool:
        if not self.remote:
            return os.path.exists(path)
        import pyarrow.fs as pafs

        from flightfeed.server.storage.s3_client import split_s3_uri, with_retries

        assert self._fs is not None
        fs = self._fs
        _, key = split_s3_uri(path)
        return with_retries(lambda: fs.get_file_info(key), path).type != pafs.FileType.NotFound

    def join(self, *parts: str) -> str:
        return "/".join((parts[0].rstrip("/"), *parts[1:])) if self.remote else os.path.join(*parts)

    def _list_remote(self, uri: str) -> list[str]:
        import pyarrow.fs as pafs

        from flightfeed.server.storage.s3_client import split_s3_uri, with_retries

        assert self._fs is not None
        fs = self._fs
        bucket, key = split_s3_uri(uri)
        info = with_retries(lambda: fs.get_file_info(key), uri)
        if info.type == pafs.FileType.File:
            return [uri]
        if info.type == pafs.FileType.NotFound:
            raise StorageError(f"{uri}: no such object or prefix in bucket {bucket!r}")
        listing = with_retries(lambda: fs.get_file_info(pafs.FileSelector(key, recursive=True)), uri)
        return [
            f"s3://{i.path}"
            for i in listing
            if i.type == pafs.FileType.File and not any(part.startswith(".") for part in i.path[len(key) :].split("/"))
        ]

    def index_json(self, src: str, kind: str) -> tuple[str, str, dict[str, Any]]:
        """``(root, index_uri, index)``: the ``index.json`` of the dataset ``src`` (the folder or
        the file itself) parsed; refused, naming it, when it cannot be read as JSON (``kind``:
        "MosaicML Streaming", "LitData")."""
        root = src.rstrip("/")
        index_uri = root if root.endswith("index.json") else self.join(root, "index.json")
        try:
            with self.local(index_uri) as path, open(path, encoding="utf-8") as fh:
                index = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{index_uri}: not a readable {kind} index.json: {exc}") from None
        if not isinstance(index, dict):
            raise ConfigError(f"{index_uri}: not a {kind} index.json (a JSON object is expected)")
        return index_uri[: -len("index.json")].rstrip("/"), index_uri, index

    @contextmanager
    def local(self, path: str) -> Iterator[str]:
        """A local path holding ``path``'s bytes while the block runs (S3: a temporary copy)."""
        if not self.remote:
            yield path
            return
        import pyarrow.fs as pafs

        from flightfeed.server.storage.s3_client import download, split_s3_uri, with_retries

        assert self._fs is not None
        fs = self._fs
        _, key = split_s3_uri(path)
        info = with_retries(lambda: fs.get_file_info(key), path)
        if info.type != pafs.FileType.File:
            raise StorageError(f"{path}: no such object")
        size = info.size or 0
        tmp = tempfile.mkdtemp(prefix="flightfeed-convert-src-")
        dest = os.path.join(tmp, os.path.basename(key))
        try:
            opts = self._storage
            with_retries(
                lambda: download(fs, key, size, dest, part_size=opts.s3_part_size, parallel=opts.s3_parallel),
                path,
                retries=opts.s3_retries,
            )
            yield dest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def local_dir(self, path: str, names: list[str]) -> Iterator[str]:
        """A local directory holding the files ``names`` of the directory ``path``."""
        if not self.remote:
            yield path
            return
        tmp = tempfile.mkdtemp(prefix="flightfeed-convert-src-")
        try:
            for name in names:
                uri = self.join(path, name)
                if self.exists(uri):
                    with self.local(uri) as copy:
                        shutil.move(copy, os.path.join(tmp, name))
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
