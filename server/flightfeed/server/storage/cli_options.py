"""Storage settings on the command line: the flags shared by ``serve``, ``convert`` and
``inspect``, and the one place that turns flags plus AWS environment variables into
``StorageOptions``. The environment arrives as an argument (``run`` passes ``os.environ``);
library code never reads it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence

from flightfeed.server.storage.options import StorageOptions
from flightfeed.wire.errors import ConfigError

__all__ = [
    "add_s3_arguments",
    "add_cache_arguments",
    "add_reader_arguments",
    "storage_options_from_args",
    "parse_size",
    "size_argument",
    "parse_casts",
]

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"512MB"`` -> 512_000_000, ``"1GiB"`` -> 2**30, ``"4096"`` -> 4096."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigError(f"{text!r} is not a size (examples: 4096, 512MB, 1GiB)")
    number, unit, binary = match.groups()
    unit = unit.lower()
    scale = 1024 ** "bkmgt".index(unit) if binary and unit else _UNITS[unit]
    return int(float(number) * scale)


def parse_casts(items: Sequence[str]) -> dict[str, str]:
    """``["x=float32", "y=int32"]`` -> ``{"x": "float32", "y": "int32"}``."""
    out: dict[str, str] = {}
    for item in items:
        column, sep, dtype = item.partition("=")
        if not sep or not column or not dtype:
            raise ConfigError(f"--cast {item!r}: expected COLUMN=DTYPE, e.g. --cast x=float32")
        out[column] = dtype
    return out


def size_argument(text: str) -> int:
    """``parse_size`` for argparse ``type=`` (a bad value becomes a usage error)."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("object storage (s3://)")
    group.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    group.add_argument("--s3-region", metavar="REGION", help="S3 region (default: AWS_REGION or the SDK's)")


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shard cache (for s3:// datasets)")
    group.add_argument("--cache-dir", metavar="DIR", help="local shard cache (default ~/.cache/flightfeed/shards)")
    group.add_argument(
        "--cache-size",
        metavar="BYTES",
        type=size_argument,
        help="cache limit, e.g. 200GB (default: half the free disk)",
    )


def add_reader_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HDF5 sources")
    group.add_argument("--hdf5-group", metavar="GROUP", help="the HDF5 group whose datasets become columns")
    group.add_argument(
        "--cast",
        metavar="COLUMN=DTYPE",
        action="append",
        default=[],
        help="serve a column as another dtype, e.g. x=float32 (repeatable)",
    )


def storage_options_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> StorageOptions:
    """StorageOptions from the flags above (where the parser has them) and AWS variables."""
    endpoint = (
        getattr(args, "s3_endpoint", None) or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    )
    region = getattr(args, "s3_region", None) or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    return StorageOptions(
        s3_endpoint=endpoint or None,
        s3_region=region or None,
        s3_access_key=environ.get("AWS_ACCESS_KEY_ID") or None,
        s3_secret_key=environ.get("AWS_SECRET_ACCESS_KEY") or None,
        s3_session_token=environ.get("AWS_SESSION_TOKEN") or None,
        cache_dir=getattr(args, "cache_dir", None),
        cache_size=getattr(args, "cache_size", None),
        hdf5_group=getattr(args, "hdf5_group", None),
        casts=parse_casts(getattr(args, "cast", None) or []),
    )
