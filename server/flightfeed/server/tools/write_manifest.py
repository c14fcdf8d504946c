"""``flightfeed inspect DIR --write-manifest``: a ``manifest.json`` for a local dataset that has
none (or one without block checksums), so the server can verify its bytes.

Every shard is hashed (sha256 and the checksums of its blocks). When a manifest is already there,
its shards must still match their recorded sha256: bytes that changed since are never blessed
(restore the shard, or delete the old manifest to accept the current bytes).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from flightfeed.server.readers.blocks import BLOCK_BYTES, digest_file
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.resolve import StorageOptions, open_dataset
from flightfeed.server.storage.verify import local_manifest
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["write_manifest"]


def write_manifest(uri: str, options: StorageOptions | None = None, *, block_bytes: int = BLOCK_BYTES) -> str:
    """Write ``manifest.json`` with block checksums into the local dataset directory ``uri``;
    returns its path."""
    root = uri[len("file://") :] if uri.startswith("file://") else uri
    if uri.startswith("s3://") or not os.path.isdir(root):
        raise ConfigError(
            f"--write-manifest {uri}: give a local dataset directory (for S3, write the manifest where the "
            "shards are converted: `flightfeed convert` writes one)"
        )
    if block_bytes < 4096:
        raise ConfigError(f"--block-size {block_bytes}: must be at least 4096 bytes (default 8MiB)")
    old = local_manifest(root)
    listed = {e.name: e for e in old[1].shards} if old is not None else {}
    opts = replace(options or StorageOptions(), verify="off")
    ds = open_dataset("manifest", root, opts)
    try:
        shards: list[ManifestShard] = []
        for shard in ds.shards:
            path = str(getattr(shard, "path", shard.uri))
            name = os.path.relpath(path, root)
            sha256, blocks = digest_file(path, block_bytes)
            before = listed.get(name)
            if before is not None and before.sha256 != sha256:
                raise DatasetError(
                    f"shard {path} no longer matches {os.path.join(root, MANIFEST_NAME)} (sha256 {sha256}, recorded "
                    f"{before.sha256}): its bytes changed, so they are not blessed; restore the shard, or delete "
                    "the old manifest to accept the current bytes"
                )
            counts = tuple(int(n) for n in np.diff(shard.chunk_offsets))
            shards.append(ManifestShard(name, shard.num_rows, os.path.getsize(path), sha256, counts, blocks))
        if old is not None:
            manifest = replace(old[1], shards=shards)
        else:
            manifest = Manifest(ds.schema, shards, compression=_compression(shards, root), source=root)
    finally:
        ds.close()
    target = os.path.join(root, MANIFEST_NAME)
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(manifest.to_json())
    os.replace(tmp, target)
    return target


def _compression(shards: list[ManifestShard], root: str) -> str:
    from flightfeed.server.readers import format_of
    from flightfeed.server.readers.arrow.meta import ipc_compression

    path = os.path.join(root, shards[0].name)
    return ipc_compression(path) if format_of(path) == "arrow" else "none"
