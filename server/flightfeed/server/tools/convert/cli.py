"""The ``flightfeed convert`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``.

The one place where convert's settings enter, including the AWS variables for an s3:// DST.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

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
from flightfeed.server.tools.convert.pipeline import ConvertSettings, convert
from flightfeed.server.tools.convert.sources.formats import FORMAT_KINDS
from flightfeed.server.tools.convert.sources.images import split_folders
from flightfeed.server.tools.convert.sources.splits import convert_splits, split_destination
from flightfeed.server.tools.convert.sources.token_sources import add_token_arguments
from flightfeed.wire.errors import ConfigError, FlightFeedError

__all__ = ["add_arguments", "run"]


_DESCRIPTION = (
    "Convert HDF5, Parquet, NumPy (.npy/.npz), an image folder (CLASS/*.jpg|png), WebDataset tars, LMDB, "
    "TFRecord, MosaicML MDS, LitData or a Hugging Face save_to_disk folder into sharded .arrow files plus "
    "manifest.json; DST (and SRC for those formats) may be s3://bucket/prefix."
)


def _resize(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None or 0 in (int(match.group(1)), int(match.group(2))):
        raise argparse.ArgumentTypeError(f"--resize {text!r}: expected WIDTHxHEIGHT, e.g. 224x224")
    return int(match.group(1)), int(match.group(2))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = _DESCRIPTION
    parser.add_argument(
        "src", metavar="SRC",
        help="a file, directory, glob or brace pattern (train-{000000..000146}.tar) of the source"
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
        choices=("auto", "hdf5", "parquet", "numpy", "images", *FORMAT_KINDS, "nanogpt", "megatron"),
        default="auto",
        help="source kind (default: detected)",
    )
    add_token_arguments(parser)
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
        "--on-bad-record", choices=("error", "skip"), default="error",
        help="webdataset/lmdb/tfrecord/mds/litdata/hf: a record that cannot be read stops the conversion naming "
        "its file and key or offset (error, default) or is left out and counted in manifest.json (skip)",
    )
    parser.add_argument(
        "--lmdb-decoder", choices=("msgpack", "raw", "pickle"), default="msgpack",
        help="lmdb: msgpack'd (image_bytes, label) under keys '0'..'N-1' with __len__ (default), or raw key/value "
        "bytes; pickle is refused (flightfeed never unpickles)",
    )
    parser.add_argument(
        "--no-source-path", action="store_true",
        help="images: no source_path column (by default each row keeps its file's path relative to SRC)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset already converted into DST")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--hash-thread",
        action="store_true",
        help="hash shards (sha256) on a second thread while the source is read: faster where a core is free, "
        "slower on a busy machine (figures in bench/history.md)",
    )
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
            on_bad_record=args.on_bad_record,
            lmdb_decoder=args.lmdb_decoder,
            overwrite=args.overwrite,
            eot=args.eot,
            token_dtype=args.token_dtype,
            progress=not args.no_progress,
            background_hash=args.hash_thread,
            storage=storage_options_from_args(args, os.environ),
            source_path=not args.no_source_path,
        )
        splits = split_folders(args.src) if args.kind in ("auto", "images") else []
        started = time.perf_counter()
        if splits:  # ROOT/train, ROOT/val: one dataset per split, never classes named after splits
            print(f"{args.src} holds the splits {', '.join(splits)}: converting each into its own dataset")
            manifests = convert_splits(args.src, args.dst, settings)
        else:
            manifests = {"": convert(args.src, args.dst, settings)}
        seconds = max(1e-9, time.perf_counter() - started)
    except FlightFeedError as exc:
        print(f"flightfeed convert: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "flightfeed convert: interrupted; the dataset being written was removed (one converted into its "
            "folder before is left as it was)",
            file=sys.stderr,
        )
        return 130
    for split, manifest in manifests.items():
        _report(manifest, split_destination(args.dst, split) if split else args.dst, None if splits else seconds)
    if splits:
        serve = " ".join(f"{s}={split_destination(args.dst, s)}" for s in splits)
        print(f"converted {len(splits)} splits in {seconds:.1f} s; serve them with: flightfeed serve {serve}")
    return 0


def _report(manifest: Manifest, dst: str, seconds: float | None) -> None:
    rates = (
        f" in {seconds:.1f} s: {manifest.rows / seconds:,.0f} rows/s, {manifest.nbytes / 1e6 / seconds:.1f} MB/s"
        if seconds is not None else ""
    )
    print(
        f"wrote {manifest.rows} rows in {len(manifest.shards)} shard(s), {manifest.nbytes / 1e6:.1f} MB, "
        f"to {dst} (manifest.json){rates}"
    )
    bad = manifest.extra.get("bad_records")
    if isinstance(bad, dict) and bad.get("skipped"):
        named = list((bad.get("named") or {}).items())[:5]
        shown = "; ".join(f"{where} ({why})" for where, why in named)
        print(f"skipped {bad['skipped']} bad record(s) (--on-bad-record skip): {shown} (all counted in manifest.json)",
              file=sys.stderr)
    skipped = manifest.extra.get("skipped_images") or {}
    if skipped:
        shown = "; ".join(f"{path} ({why})" for path, why in list(skipped.items())[:5])
        more = f" and {len(skipped) - 5} more (all in manifest.json)" if len(skipped) > 5 else ""
        print(f"skipped {len(skipped)} image(s) that do not decode: {shown}{more}", file=sys.stderr)
