"""Where converted shards go: a local directory, or ``s3://bucket/prefix`` (shards are written in
a local temporary directory, uploaded as each one completes, and deleted locally). The manifest
is written last, so a reader that sees ``manifest.json`` sees every shard it lists.

A conversion stages its shards in a hidden folder or prefix inside DST (``.flightfeed-convert-*``,
which ``flightfeed serve`` never lists) and moves them into DST (on S3: copies them server-side)
only once every shard is written: a conversion stopped part-way (Ctrl-C, an error, a full disk) leaves
no ``part-*.arrow`` that ``flightfeed serve DST`` would serve as if it were the whole dataset, and
``--overwrite`` keeps the old dataset until the new one is complete. DST may hold other files, but
no other shard files (``.arrow``, ``.parquet``, HDF5 anywhere under it): ``serve DST`` walks the
folder (or lists the prefix) and would serve them with the converted rows.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
import uuid
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


_log = logging.getLogger(__name__)
#: the hidden folder inside DST where a conversion stages its shards (never served)
STAGING_PREFIX = ".flightfeed-convert-"
#: S3 copies objects of up to 5 GiB server-side; larger shards are uploaded from the local disk
_COPY_LIMIT = 5 << 30


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
        stale = sorted(glob.glob(os.path.join(glob.escape(directory), STAGING_PREFIX + "*")))
        if stale and overwrite:
            for path in stale:  # a killed conversion's staged shards (never served)
                shutil.rmtree(path, ignore_errors=True)
        elif stale:
            _log.warning(
                "%s holds %d staging folder(s) of conversions that were killed (%s); never served, they only take "
                "disk space: delete them, or convert with --overwrite", directory, len(stale), stale[0],
            )
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
    """Shards are uploaded as they complete under a hidden prefix (``PREFIX/.flightfeed-convert-*/``,
    never listed by ``serve``) and copied into place server-side once all are written; a shard of
    5 GiB or more (past S3's copy limit) waits on the local disk and is uploaded then."""

    def __init__(self, uri: str, storage: StorageOptions, *, overwrite: bool) -> None:
        from flightfeed.server.storage.s3 import filesystem_for
        from flightfeed.server.storage.s3_client import split_s3_uri, with_retries

        self.uri = uri.rstrip("/")
        bucket, self._root = split_s3_uri(uri)
        self._root = self._root.rstrip("/")
        self._fs = filesystem_for(storage)
        self._retries = storage.s3_retries
        self._with_retries = with_retries
        if with_retries(lambda: self._fs.get_file_info(bucket), uri).type == pafs.FileType.NotFound:
            raise StorageError(f"{uri}: bucket {bucket!r} does not exist; create it first")
        selector = pafs.FileSelector(self._root, recursive=True, allow_not_found=True)
        listing = with_retries(lambda: self._fs.get_file_info(selector), uri)
        files = [i for i in listing if i.type == pafs.FileType.File]
        top = [i for i in files if i.path.rsplit("/", 1)[0] == self._root]
        old = [
            i.path
            for i in top
            if i.base_name == MANIFEST_NAME or (i.base_name.startswith("part-") and i.base_name.endswith(".arrow"))
        ]
        if old and not overwrite:
            raise ConfigError(
                f"{uri} already holds a converted dataset ({len(old)} object(s)); "
                "choose an empty prefix or pass --overwrite"
            )
        others = [
            i.path
            for i in files
            if i.path not in old
            and i.path.lower().endswith(SHARD_SUFFIXES)
            and not any(h in "/" + i.path[len(self._root) :] for h in ("/.", "/_"))  # as list_s3_shards
        ]
        if others:
            raise ConfigError(
                f"{uri} already holds {len(others)} other shard object(s) (e.g. s3://{others[0]}); `flightfeed serve "
                f"{uri}` would serve them together with the converted rows: convert into an empty prefix"
            )
        self._old = old  # removed by finish, once the new dataset is complete
        self._stage = f"{self._root}/{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        self._staged: set[str] = set()
        self.staging_dir = tempfile.mkdtemp(prefix="flightfeed-convert-")

    def publish(self, path: str, shard: ManifestShard) -> None:
        if shard.bytes >= _COPY_LIMIT:
            return  # uploaded by finish, from the local disk
        self._upload(path, f"{self._stage}/{shard.name}")
        self._staged.add(shard.name)
        os.unlink(path)

    def finish(self, manifest: Manifest) -> None:
        for path in sorted(self._old, key=lambda p: not p.endswith(MANIFEST_NAME)):  # the manifest first
            self._delete(path)
        for shard in manifest.shards:
            target = f"{self._root}/{shard.name}"
            if shard.name in self._staged:
                source = f"{self._stage}/{shard.name}"
                self._copy(source, target)
            else:
                self._upload(os.path.join(self.staging_dir, shard.name), target)
        if self._staged:
            self._drop_stage()
        path = os.path.join(self.staging_dir, MANIFEST_NAME)
        with open(path, "w", encoding="utf-8") as f:
            f.write(manifest.to_json())
        self._upload(path, f"{self._root}/{MANIFEST_NAME}")

    def cleanup(self) -> None:
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        if self._staged:  # a conversion stopped part-way: its staged shards go
            with contextlib.suppress(Exception):
                self._drop_stage()

    def _drop_stage(self) -> None:
        """Delete the staging prefix (its shards, and the folder marker pyarrow leaves)."""
        stage = self._stage
        self._with_retries(lambda: self._fs.delete_dir(stage), f"s3://{stage}", retries=self._retries)
        self._staged.clear()

    def _copy(self, source: str, target: str) -> None:
        self._with_retries(lambda: self._fs.copy_file(source, target), f"s3://{target}", retries=self._retries)

    def _delete(self, path: str) -> None:
        self._with_retries(lambda: self._fs.delete_file(path), f"s3://{path}", retries=self._retries)

    def _upload(self, path: str, target: str) -> None:
        from flightfeed.server.storage.s3_client import upload

        self._with_retries(lambda: upload(self._fs, path, target), f"s3://{target}", retries=self._retries)
