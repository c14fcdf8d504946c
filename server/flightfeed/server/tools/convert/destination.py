"""Where converted shards go: a local directory, or ``s3://bucket/prefix`` (shards are staged in
a local temporary directory, uploaded as each one completes, and deleted locally). The manifest
is written last, so a reader that sees ``manifest.json`` sees every shard it lists.

A local conversion writes its shards into a hidden staging folder inside DST
(``.flightfeed-convert-*``, which ``flightfeed serve`` never lists) and moves them into DST only
once every shard is written: a conversion stopped part-way (Ctrl-C, an error, a full disk) leaves
no ``part-*.arrow`` that ``flightfeed serve DST`` would serve as if it were the whole dataset, and
``--overwrite`` keeps the old dataset until the new one is complete. DST may hold other files, but
no other shard files (``.arrow``, ``.parquet``, HDF5 anywhere under it): ``serve DST`` walks the
folder and would serve them with the converted rows.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Protocol

import pyarrow.fs as pafs

from flightfeed.server.storage.local import SHARD_SUFFIXES
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.options import StorageOptions
from flightfeed.wire.errors import ConfigError, StorageError

__all__ = ["Destination", "LocalDestination", "S3Destination", "open_destination", "STAGING_PREFIX"]


class Destination(Protocol):
    uri: str
    staging_dir: str

    def publish(self, path: str, shard: ManifestShard) -> None: ...

    def finish(self, manifest: Manifest) -> None: ...

    def cleanup(self) -> None: ...


def open_destination(dst: str, storage: StorageOptions, *, overwrite: bool) -> Destination:
    if dst.startswith("s3://"):
        return S3Destination(dst, storage, overwrite=overwrite)
    return LocalDestination(dst, overwrite=overwrite)


#: the hidden folder inside DST where a local conversion stages its shards (never served)
STAGING_PREFIX = ".flightfeed-convert-"


class LocalDestination:
    def __init__(self, directory: str, *, overwrite: bool) -> None:
        self.uri = directory
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise ConfigError(f"{directory} exists and is not a directory; DST must be a directory")
        os.makedirs(directory, exist_ok=True)
        old = glob.glob(os.path.join(directory, "part-*.arrow")) + glob.glob(os.path.join(directory, "part-*.tmp"))
        old += glob.glob(os.path.join(directory, MANIFEST_NAME))
        if old and not overwrite:
            raise ConfigError(
                f"{directory} already holds a converted dataset ({len(old)} file(s)); "
                "choose an empty directory or pass --overwrite"
            )
        _refuse_other_shards(directory)
        self._old = old  # removed by finish, once the new dataset is complete
        self.staging_dir = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=directory)

    def publish(self, path: str, shard: ManifestShard) -> None:
        pass  # staged until finish: a stopped conversion leaves nothing that serves

    def finish(self, manifest: Manifest) -> None:
        manifest_path = os.path.join(self.uri, MANIFEST_NAME)
        if os.path.exists(manifest_path):
            os.unlink(manifest_path)  # first: the old shards are no longer a dataset
        for path in self._old:
            if os.path.exists(path):
                os.unlink(path)
        for shard in manifest.shards:
            os.replace(os.path.join(self.staging_dir, shard.name), os.path.join(self.uri, shard.name))
        tmp = os.path.join(self.staging_dir, MANIFEST_NAME + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        os.replace(tmp, manifest_path)

    def cleanup(self) -> None:
        shutil.rmtree(self.staging_dir, ignore_errors=True)


def _refuse_other_shards(directory: str) -> None:
    """Refuse a DST holding shard files other than a converted dataset's ``part-*``: ``flightfeed
    serve DST`` walks the folder (hidden folders aside) and would serve them with the new rows."""
    found: list[str] = []
    for top, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.lower().endswith(SHARD_SUFFIXES):
                continue
            if top == directory and name.startswith("part-") and name.endswith(".arrow"):
                continue  # the converted dataset --overwrite replaces
            found.append(os.path.join(top, name))
    if found:
        raise ConfigError(
            f"{directory} already holds {len(found)} other shard file(s) (e.g. {found[0]}); `flightfeed serve "
            f"{directory}` would serve them together with the converted rows: convert into an empty directory "
            "(or one without .arrow/.parquet/HDF5 files anywhere under it)"
        )


class S3Destination:
    def __init__(self, uri: str, storage: StorageOptions, *, overwrite: bool) -> None:
        from flightfeed.server.storage.s3 import filesystem_for
        from flightfeed.server.storage.s3_client import split_s3_uri, with_retries

        self.uri = uri.rstrip("/")
        bucket, self._root = split_s3_uri(uri)
        self._fs = filesystem_for(storage)
        self._retries = storage.s3_retries
        self._with_retries = with_retries
        if with_retries(lambda: self._fs.get_file_info(bucket), uri).type == pafs.FileType.NotFound:
            raise StorageError(f"{uri}: bucket {bucket!r} does not exist; create it first")
        selector = pafs.FileSelector(self._root, recursive=True, allow_not_found=True)
        listing = with_retries(lambda: self._fs.get_file_info(selector), uri)
        old = [
            i.path
            for i in listing
            if i.type == pafs.FileType.File
            and (i.base_name == MANIFEST_NAME or (i.base_name.startswith("part-") and i.base_name.endswith(".arrow")))
        ]
        if old and not overwrite:
            raise ConfigError(
                f"{uri} already holds a converted dataset ({len(old)} object(s)); "
                "choose an empty prefix or pass --overwrite"
            )
        for path in old:
            self._delete(path)
        self.staging_dir = tempfile.mkdtemp(prefix="flightfeed-convert-")

    def publish(self, path: str, shard: ManifestShard) -> None:
        self._upload(path, shard.name)
        os.unlink(path)

    def finish(self, manifest: Manifest) -> None:
        path = os.path.join(self.staging_dir, MANIFEST_NAME)
        with open(path, "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        self._upload(path, MANIFEST_NAME)

    def cleanup(self) -> None:
        shutil.rmtree(self.staging_dir, ignore_errors=True)

    def _delete(self, path: str) -> None:
        self._with_retries(lambda: self._fs.delete_file(path), f"s3://{path}", retries=self._retries)

    def _upload(self, path: str, name: str) -> None:
        from flightfeed.server.storage.s3_client import upload

        target = f"{self._root}/{name}"
        self._with_retries(lambda: upload(self._fs, path, target), f"s3://{target}", retries=self._retries)
