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
    "parse_hdf5_groups",
    "parse_hdf5_columns",
    "add_chunk_cache_argument",
    "apply_config",
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
        help="cache limit, e.g. 200GB (default: half the free disk); 0: .arrow shards are read by range "
        "through memory, nothing on disk",
    )
    group.add_argument(
        "--s3-reads",
        choices=("auto", "ranges", "whole"),
        default=None,
        help="remote .arrow shards: by record batch into a block cache ('ranges'), downloaded whole ('whole'), "
        "or 'auto' (default): by range when a shard is larger than --s3-range-shard-bytes or than the cache "
        "(docs/remote-reads.md)",
    )
    group.add_argument(
        "--s3-range-shard-bytes",
        metavar="BYTES",
        type=size_argument,
        default=None,
        help="with --s3-reads auto, read remote .arrow shards larger than this by range (default 64MiB)",
    )


def parse_hdf5_groups(items: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """``--hdf5-group`` values -> (the group for every HDF5 dataset, dataset name -> its own group).

    ``GROUP`` applies to every HDF5 dataset; ``NAME=GROUP`` to dataset NAME only (a group whose
    name holds ``=`` is written with its leading ``/``: ``/a=b`` is a group)."""
    shared: str | None = None
    per: dict[str, str] = {}
    for item in items:
        name, sep, group = item.partition("=")
        if sep and name and "/" not in name:
            if not group:
                raise ConfigError(f"--hdf5-group {item!r}: expected NAME=GROUP, e.g. --hdf5-group train=/train")
            if name in per:
                raise ConfigError(f"--hdf5-group: dataset {name!r} is given a group twice")
            per[name] = group
        elif shared is not None:
            raise ConfigError(
                f"--hdf5-group {shared!r} and {item!r}: one group for every dataset at most; give other datasets "
                "their own with --hdf5-group NAME=GROUP"
            )
        else:
            shared = item
    return shared, per


def parse_hdf5_columns(items: Sequence[str]) -> tuple[tuple[str, ...] | None, dict[str, tuple[str, ...]]]:
    """``--hdf5-columns`` values -> (the datasets picked for every HDF5 dataset, dataset name -> its own).

    ``DS1,DS2`` picks the datasets of the served group that become columns, for every HDF5 dataset;
    ``NAME=DS1,DS2`` for dataset NAME only (as ``--hdf5-group``)."""
    shared: tuple[str, ...] | None = None
    per: dict[str, tuple[str, ...]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        per_dataset = bool(sep and name and "/" not in name)
        picked = tuple(p.strip() for p in (rest if per_dataset else item).split(",") if p.strip())
        if not picked:
            raise ConfigError(f"--hdf5-columns {item!r}: expected [NAME=]DS1,DS2, e.g. --hdf5-columns temp,time")
        if per_dataset:
            if name in per:
                raise ConfigError(f"--hdf5-columns: dataset {name!r} is given its columns twice")
            per[name] = picked
        elif shared is not None:
            raise ConfigError(
                f"--hdf5-columns {','.join(shared)!r} and {item!r}: one pick for every dataset at most; give other "
                "datasets their own with --hdf5-columns NAME=DS1,DS2"
            )
        else:
            shared = picked
    return shared, per


def add_chunk_cache_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chunk-cache",
        metavar="BYTES",
        type=size_argument,
        default=None,
        help="decoded HDF5/Parquet chunks kept per dataset, e.g. 2GiB (default 512MiB); shuffle windows "
        "are sized to fit in it",
    )


def apply_config(options: StorageOptions, args: argparse.Namespace, config: Mapping[str, object]) -> None:
    """Settings of a ``--config`` file that flags did not give: ``chunk_cache`` (bytes or a size
    text), ``hdf5_group`` (a group, or a table of dataset name -> group) and ``hdf5_columns``
    (``"a,b"`` / ``["a", "b"]``, or a table of dataset name -> such a list)."""
    cache = getattr(args, "chunk_cache", None)
    if cache is None:
        cache = config.get("chunk_cache", config.get("chunk-cache"))
        if isinstance(cache, str):
            cache = parse_size(cache)
    if cache is not None:
        if not isinstance(cache, int) or cache < 1:
            raise ConfigError(f"chunk_cache {cache!r}: expected a positive size, e.g. 2GiB")
        options.chunk_cache_bytes = cache
    groups = config.get("hdf5_group", config.get("hdf5-group"))
    if not getattr(args, "hdf5_group", None) and groups is not None:
        if isinstance(groups, str):
            options.hdf5_group = groups
        elif isinstance(groups, Mapping) and all(isinstance(v, str) for v in groups.values()):
            options.hdf5_groups = {str(k): str(v) for k, v in groups.items()}
        else:
            raise ConfigError(f"hdf5_group {groups!r}: expected a group name or a table of dataset name = group")
    picks = config.get("hdf5_columns", config.get("hdf5-columns"))
    if not getattr(args, "hdf5_columns", None) and picks is not None:
        if isinstance(picks, Mapping):
            options.hdf5_columns_per = {str(k): _dataset_list(v, f"hdf5_columns.{k}") for k, v in picks.items()}
        else:
            options.hdf5_columns = _dataset_list(picks, "hdf5_columns")


def _dataset_list(value: object, key: str) -> tuple[str, ...]:
    """A config file's pick of datasets: ``"a,b"`` or ``["a", "b"]``."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{key} {value!r}: expected dataset names, e.g. \"temp,time\" or [\"temp\", \"time\"]")
    picked = tuple(v.strip() for v in items if v.strip())
    if not picked:
        raise ConfigError(f"{key} {value!r}: names no dataset")
    return picked


def add_reader_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HDF5 and netCDF-4 sources")
    group.add_argument(
        "--hdf5-group",
        metavar="[NAME=]GROUP",
        action="append",
        default=[],
        help="the HDF5 group whose datasets become columns; NAME=GROUP for dataset NAME only (repeatable)",
    )
    group.add_argument(
        "--hdf5-columns",
        metavar="[NAME=]DS1,DS2",
        action="append",
        default=[],
        help="only these datasets of the group become columns (e.g. those of one length, where a netCDF or "
        "Keras file mixes lengths); NAME=DS1,DS2 for dataset NAME only (repeatable)",
    )
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
    group, groups = parse_hdf5_groups(getattr(args, "hdf5_group", None) or [])
    picked, picked_per = parse_hdf5_columns(getattr(args, "hdf5_columns", None) or [])
    options = StorageOptions(
        s3_endpoint=endpoint or None,
        s3_region=region or None,
        s3_access_key=environ.get("AWS_ACCESS_KEY_ID") or None,
        s3_secret_key=environ.get("AWS_SECRET_ACCESS_KEY") or None,
        s3_session_token=environ.get("AWS_SESSION_TOKEN") or None,
        cache_dir=getattr(args, "cache_dir", None),
        cache_size=getattr(args, "cache_size", None),
        hdf5_group=group,
        hdf5_groups=groups,
        hdf5_columns=picked,
        hdf5_columns_per=picked_per,
        casts=parse_casts(getattr(args, "cast", None) or []),
    )
    if getattr(args, "chunk_cache", None) is not None:
        options.chunk_cache_bytes = int(args.chunk_cache)
    if getattr(args, "s3_reads", None) is not None:
        options.s3_reads = str(args.s3_reads)
    if getattr(args, "s3_range_shard_bytes", None) is not None:
        options.range_shard_bytes = int(args.s3_range_shard_bytes)
    return options
