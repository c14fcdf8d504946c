"""The ``flightfeed convert`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``.

The one place where convert's settings enter, including the AWS variables for an s3:// DST.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from flightfeed.server.storage.cli_options import (
    add_reader_arguments,
    add_s3_arguments,
    parse_casts,
    parse_hdf5_columns,
    parse_hdf5_groups,
    size_argument,
    storage_options_from_args,
)
from flightfeed.server.storage.manifest import Manifest
from flightfeed.server.tools.convert.images import split_folders
from flightfeed.server.tools.convert.pipeline import ConvertSettings, convert
from flightfeed.server.tools.convert.splits import convert_splits, split_destination
from flightfeed.wire.errors import ConfigError, FlightFeedError

__all__ = ["add_arguments", "run"]


_DESCRIPTION = (
    "Convert HDF5, Parquet, NumPy (.npy/.npz) or an image folder (CLASS/*.jpg|png) into sharded .arrow "
    "files plus manifest.json; DST may be s3://bucket/prefix."
)


def _resize(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None or 0 in (int(match.group(1)), int(match.group(2))):
        raise argparse.ArgumentTypeError(f"--resize {text!r}: expected WIDTHxHEIGHT, e.g. 224x224")
    return int(match.group(1)), int(match.group(2))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = _DESCRIPTION
    parser.add_argument(
        "src", metavar="SRC", help="a file, directory or glob of HDF5/Parquet/NumPy, or an image folder"
    )
    parser.add_argument("dst", metavar="DST", help="output directory or s3://bucket/prefix")
    parser.add_argument("--shard-size", type=size_argument, default="512MB", help="bytes per shard (default 512MB)")
    parser.add_argument(
        "--block-size", type=size_argument, default="8MiB",
        help="bytes per checksum block in the manifest (default 8MiB): the server verifies each block "
        "before any of its rows leave the node",
    )
    parser.add_argument(
        "--compression",
        choices=("lz4", "zstd", "none"),
        default="none",
        help="IPC body compression (default none: shards stay memory-mappable without decoding)",
    )
    parser.add_argument("--rows-per-batch", type=int, metavar="N", help="rows per record batch (default: ~8 MiB)")
    parser.add_argument(
        "--from",
        dest="kind",
        choices=("auto", "hdf5", "parquet", "numpy", "images"),
        default="auto",
        help="source kind (default: detected)",
    )
    parser.add_argument("--decode", action="store_true", help="images: store decoded uint8 HxWx3 tensors")
    parser.add_argument("--resize", type=_resize, metavar="WxH", help="images: resize to WxH (with --decode)")
    parser.add_argument(
        "--max-side", type=int, metavar="N",
        help="images: re-encode those whose longer side exceeds N to N (JPEG quality 90; aspect ratio kept)",
    )
    parser.add_argument(
        "--on-bad-image", choices=("error", "skip"), default="error",
        help="images: a file that does not decode stops the conversion naming it (error, default) or is left "
        "out and counted (skip)",
    )
    parser.add_argument(
        "--no-source-path", action="store_true",
        help="images: no source_path column (by default each row keeps its file's path relative to SRC)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already converted into DST")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_reader_arguments(parser)
    add_s3_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        group, per_dataset = parse_hdf5_groups(args.hdf5_group)
        if per_dataset:
            raise ConfigError("convert reads one source: give its group as --hdf5-group GROUP (no NAME=)")
        picked, picked_per = parse_hdf5_columns(args.hdf5_columns)
        if picked_per:
            raise ConfigError("convert reads one source: give its datasets as --hdf5-columns DS1,DS2 (no NAME=)")
        settings = ConvertSettings(
            shard_bytes=args.shard_size,
            block_bytes=args.block_size,
            compression=args.compression,
            rows_per_batch=args.rows_per_batch,
            kind=args.kind,
            hdf5_group=group,
            hdf5_columns=picked,
            casts=parse_casts(args.cast),
            decode=args.decode,
            resize=args.resize,
            max_side=args.max_side,
            on_bad_image=args.on_bad_image,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            storage=storage_options_from_args(args, os.environ),
            source_path=not args.no_source_path,
        )
        splits = split_folders(args.src) if args.kind in ("auto", "images") else []
        if splits:  # ROOT/train, ROOT/val: one dataset per split, never classes named after splits
            print(f"{args.src} holds the splits {', '.join(splits)}: converting each into its own dataset")
            manifests = convert_splits(args.src, args.dst, settings)
        else:
            manifests = {"": convert(args.src, args.dst, settings)}
    except FlightFeedError as exc:
        print(f"flightfeed convert: error: {exc}", file=sys.stderr)
        return 1
    for split, manifest in manifests.items():
        _report(manifest, split_destination(args.dst, split) if split else args.dst)
    if splits:
        serve = " ".join(f"{s}={split_destination(args.dst, s)}" for s in splits)
        print(f"serve them with: flightfeed serve {serve}")
    return 0


def _report(manifest: Manifest, dst: str) -> None:
    print(
        f"wrote {manifest.rows} rows in {len(manifest.shards)} shard(s), {manifest.nbytes / 1e6:.1f} MB, "
        f"to {dst} (manifest.json)"
    )
    skipped = manifest.extra.get("skipped_images") or {}
    if skipped:
        shown = "; ".join(f"{path} ({why})" for path, why in list(skipped.items())[:5])
        more = f" and {len(skipped) - 5} more (all in manifest.json)" if len(skipped) > 5 else ""
        print(f"skipped {len(skipped)} image(s) that do not decode: {shown}{more}", file=sys.stderr)
