"""Storage settings from flags and AWS variables; S3 URI and endpoint parsing; the manifest."""

from __future__ import annotations

import argparse

import pyarrow as pa
import pytest

from flightfeed.server.storage.cli_options import (
    add_cache_arguments,
    add_reader_arguments,
    add_s3_arguments,
    parse_casts,
    parse_size,
    storage_options_from_args,
)
from flightfeed.server.storage.manifest import Manifest, ManifestShard
from flightfeed.server.storage.s3_client import s3_filesystem, split_s3_uri
from flightfeed.wire.errors import ConfigError, DatasetError


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("512MB", 512 * 10**6),
        ("1GiB", 1 << 30),
        ("1.5k", 1500),
        ("2 TB", 2 * 10**12),
        ("10MiB", 10 << 20),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_bad_sizes_and_casts() -> None:
    with pytest.raises(ConfigError, match="not a size"):
        parse_size("lots")
    assert parse_casts(["x=float32", "y=int8"]) == {"x": "float32", "y": "int8"}
    with pytest.raises(ConfigError, match="COLUMN=DTYPE"):
        parse_casts(["x"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_s3_arguments(parser)
    add_cache_arguments(parser)
    add_reader_arguments(parser)
    return parser


def test_flags_and_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    args = _parser().parse_args(["--cache-dir", "/tmp/c", "--cache-size", "2GB", "--cast", "x=float32"])
    opts = storage_options_from_args(args, env)
    assert (opts.s3_endpoint, opts.s3_region) == ("http://127.0.0.1:9000", "eu-west-1")
    assert (opts.s3_access_key, opts.s3_secret_key, opts.s3_session_token) == ("key", "secret", None)
    assert (opts.cache_dir, opts.cache_size, opts.casts) == ("/tmp/c", 2 * 10**9, {"x": "float32"})
    args = _parser().parse_args(
        ["--s3-endpoint", "http://127.0.0.1:1", "--s3-region", "us-west-2", "--hdf5-group", "g"]
    )
    opts = storage_options_from_args(args, env)  # flags win over variables
    assert (opts.s3_endpoint, opts.s3_region, opts.hdf5_group) == ("http://127.0.0.1:1", "us-west-2", "g")
    assert storage_options_from_args(argparse.Namespace(), {}).s3_endpoint is None


def test_uris_and_endpoints() -> None:
    assert split_s3_uri("s3://bucket/a/b/") == ("bucket", "bucket/a/b")
    with pytest.raises(ConfigError, match="no bucket"):
        split_s3_uri("s3:///x")
    with pytest.raises(ConfigError, match="--s3-endpoint"):
        s3_filesystem(endpoint="ftp://127.0.0.1:21", access_key="k", secret_key="s")
    with pytest.raises(ConfigError, match="both") as info:
        s3_filesystem(endpoint="http://127.0.0.1:1", access_key="k")
    assert "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in str(info.value)  # the variables to set


def test_manifest_round_trip_and_errors() -> None:
    schema = pa.schema([pa.field("img", pa.fixed_shape_tensor(pa.uint8(), [2, 2])), pa.field("y", pa.int64())])
    manifest = Manifest(schema, [ManifestShard("part-00000.arrow", 30, 999, "ab" * 32, (10, 20))], "zstd", "src")
    again = Manifest.from_json(manifest.to_json(), "m.json")
    assert again.schema.equals(schema)
    assert again.shards == manifest.shards
    assert (again.rows, again.nbytes, again.compression) == (30, 999, "zstd")
    with pytest.raises(DatasetError, match=r"m\.json is not a valid flightfeed manifest"):
        Manifest.from_json('{"format": "other"}', "m.json")
    broken = manifest.to_json().replace('"rows": 30', '"rows": 31')
    with pytest.raises(DatasetError, match="lists batches of 30 rows, not 31"):
        Manifest.from_json(broken, "m.json")


def test_range_read_flags() -> None:
    """``--s3-reads`` and ``--s3-range-shard-bytes`` reach StorageOptions (docs/remote-reads.md)."""
    parser = argparse.ArgumentParser()
    add_cache_arguments(parser)
    opts = storage_options_from_args(parser.parse_args(["--cache-size", "0"]), {})
    assert opts.cache_size == 0 and opts.s3_reads == "auto" and opts.range_shard_bytes == 64 << 20
    args = parser.parse_args(["--s3-reads", "ranges", "--s3-range-shard-bytes", "8MiB"])
    opts = storage_options_from_args(args, {})
    assert opts.s3_reads == "ranges" and opts.range_shard_bytes == 8 << 20
    with pytest.raises(SystemExit):
        parser.parse_args(["--s3-reads", "sometimes"])
