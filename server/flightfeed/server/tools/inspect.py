"""``flightfeed inspect URI|grpc://host:port[/NAME]``: schema, rows, shards, bytes, compression.

For a local path or ``s3://`` prefix the dataset is opened as ``serve`` would open it (S3 shards
go through the shard cache; with a ``manifest.json`` nothing is downloaded). For a running
server the figures come from ``list_flights``/``get_flight_info`` and the ``stats`` action.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from flightfeed.server.readers import ShardReader
from flightfeed.server.storage.cli_options import (
    add_cache_arguments,
    add_reader_arguments,
    add_s3_arguments,
    size_argument,
    storage_options_from_args,
)
from flightfeed.server.storage.options import StorageOptions
from flightfeed.wire.classes import classes_of
from flightfeed.wire.errors import ConfigError, FlightFeedError, StorageError, Unauthenticated
from flightfeed.wire.tokens import normalize_token, read_token_file

__all__ = ["add_arguments", "run", "inspect_dataset", "inspect_server", "format_report"]

_SERVER_SCHEMES = ("grpc", "grpc+tcp", "grpc+tls", "grpc+unix")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    parser.add_argument(
        "target", metavar="URI", help="a directory/glob/file, s3://bucket/prefix, or grpc://host:port[/NAME]"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="hash every local shard (sha256) and check it against manifest.json when there is one",
    )
    parser.add_argument(
        "--write-manifest",
        action="store_true",
        help="write DIR/manifest.json with every shard's sha256 and block checksums (for a local dataset "
        "without one, or with one from before block checksums), so `serve` verifies its bytes",
    )
    parser.add_argument(
        "--block-size", type=size_argument, default="8MiB", help="checksum block size for --write-manifest"
    )
    parser.add_argument("--auth-token-file", metavar="F", help="bearer token for a server started with one")
    add_reader_arguments(parser)
    add_s3_arguments(parser)
    add_cache_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        if args.target.split("://", 1)[0] in _SERVER_SCHEMES:
            token = read_token_file(args.auth_token_file) if args.auth_token_file else None
            report = inspect_server(args.target, token=token)
        elif args.write_manifest:
            from flightfeed.server.tools.write_manifest import write_manifest

            options = storage_options_from_args(args, os.environ)
            path = write_manifest(args.target, options, block_bytes=args.block_size)
            print(f"wrote {path}")
            report = inspect_dataset(args.target, options, verify=True)
        else:
            options = storage_options_from_args(args, os.environ)
            if options.hdf5_groups or options.hdf5_columns_per:
                raise ConfigError(
                    "inspect reads one dataset: give its group as --hdf5-group GROUP and its datasets as "
                    "--hdf5-columns DS1,DS2 (no NAME=)"
                )
            report = inspect_dataset(args.target, options, verify=args.verify)
    except (FlightFeedError, OSError) as exc:
        print(f"flightfeed inspect: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def inspect_dataset(uri: str, options: StorageOptions | None = None, *, verify: bool = False) -> dict[str, Any]:
    """Schema, rows, bytes and per-shard figures of the dataset at ``uri``; with ``verify``, each
    local shard's sha256 and (when the dataset has a manifest.json) whether it matches."""
    from flightfeed.server.storage.resolve import open_dataset

    opts = replace(options or StorageOptions(), s3_prefetch=False, verify="off")  # look, do not download
    ds = open_dataset("inspect", uri, opts)
    try:
        compressions = _compressions(uri, ds.shards, opts)
        shards = [
            {
                "uri": shard.uri,
                "rows": shard.num_rows,
                "bytes": shard.nbytes,
                "chunks": len(shard.chunk_offsets) - 1,
                "compression": compressions[i] if i < len(compressions) else compressions[0],
                "notes": _notes(shard),  # HDF5: links followed, datasets left out
            }
            for i, shard in enumerate(ds.shards)
        ]
        if verify:
            _verify_shards(uri, ds.shards, shards)
        return {
            "target": uri,
            "kind": "dataset",
            "rows": ds.num_rows,
            "bytes": ds.nbytes,
            "shards": len(ds.shards),
            "chunks": ds.num_chunks,
            "compression": ",".join(sorted(set(compressions))),
            "fingerprint": ds.fingerprint,
            "schema": _schema(ds.schema),
            "classes": classes_of(ds.schema),
            "shard_list": shards,
        }
    finally:
        ds.close()


def _verify_shards(uri: str, readers: Sequence[ShardReader], rows: list[dict[str, Any]]) -> None:
    """Add ``sha256`` and ``verified`` (True/False against manifest.json, None without one)."""
    from flightfeed.server.storage.cache.files import sha256_file
    from flightfeed.server.storage.verify import local_manifest

    found = local_manifest(uri)
    listed = {}
    if found is not None:
        root, manifest = found
        listed = {os.path.normpath(os.path.join(root, e.name)): e.sha256 for e in manifest.shards}
    for reader, row in zip(readers, rows, strict=True):
        path = getattr(reader, "path", None)
        if not isinstance(path, str):
            row["sha256"], row["verified"] = None, None  # remote: checked by the cache on download
            continue
        row["sha256"] = sha256_file(path)
        expected = listed.get(os.path.normpath(path))
        row["verified"] = None if expected is None else row["sha256"] == expected


def _opens_to_tell(shard: Any) -> bool:
    """A local shard opened on demand (readers/lazy.py) of a format whose reader knows more
    than its path tells (HDF5, Parquet)."""
    group = getattr(shard, "group", None)
    return group is not None and getattr(group, "fmt", "arrow") != "arrow"


def _notes(shard: Any) -> list[str]:
    if _opens_to_tell(shard):
        with shard.opened() as real:
            return _notes(real)
    return list(getattr(shard, "notes", []))


def _compressions(uri: str, shards: Sequence[ShardReader], opts: StorageOptions) -> list[str]:
    """Compression per local shard; for remote ones, from the manifest or the first shard."""
    from flightfeed.server.readers.arrow.meta import ipc_compression
    from flightfeed.server.storage.remote import RemoteShard

    def of(reader: Any) -> str:
        if _opens_to_tell(reader):
            with reader.opened() as real:
                return of(real)
        if hasattr(reader, "compression"):
            return str(reader.compression)
        path = getattr(reader, "path", None)
        return ipc_compression(path) if isinstance(path, str) else "?"

    first = shards[0]
    if not isinstance(first, RemoteShard):
        return [of(s) for s in shards]
    from flightfeed.server.storage.s3 import filesystem_for, read_manifest

    manifest = read_manifest(filesystem_for(opts), uri, retries=opts.s3_retries) if uri.startswith("s3://") else None
    if manifest is not None:
        return [manifest.compression]
    with first.opened() as reader:
        path = getattr(reader, "path", None)
        return [ipc_compression(path) if first.zero_copy and isinstance(path, str) else of(reader)]


def inspect_server(target: str, *, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Datasets served at ``grpc://host:port`` (or one of them: ``grpc://host:port/NAME``)."""
    import pyarrow.flight as flight

    parts = urlsplit(target)
    location, name = f"{parts.scheme}://{parts.netloc}", parts.path.strip("/")
    # pyarrow wants bytes for header names and values (its stubs say str)
    headers: Any = [(b"authorization", f"Bearer {normalize_token(token)}".encode())] if token is not None else []
    call = flight.FlightCallOptions(timeout=timeout_s, headers=headers)
    client = flight.FlightClient(location)
    try:
        infos = list(client.list_flights(options=call))
        try:
            stats = json.loads(
                next(iter(client.do_action(flight.Action("stats", b""), options=call))).body.to_pybytes()
            )
        except (flight.FlightError, StopIteration, ValueError):
            stats = {}
        described = {d.get("name"): d for d in stats.get("datasets", []) if isinstance(d, dict)}
        datasets = []
        for info in infos:
            ds_name = info.descriptor.path[0].decode() if info.descriptor.path else "?"
            if name and ds_name != name:
                continue
            entry: dict[str, Any] = {
                "name": ds_name,
                "rows": info.total_records,
                "bytes": info.total_bytes,
                "schema": _schema(info.schema),
                "classes": classes_of(info.schema),
            }
            if ds_name in described:
                entry["shards"] = described[ds_name].get("shards")
                entry["fingerprint"] = described[ds_name].get("fingerprint")
            if name:
                streams = client.get_flight_info(flight.FlightDescriptor.for_path(ds_name), options=call)
                entry["streams"] = len(streams.endpoints)
            datasets.append(entry)
    except flight.FlightUnauthenticatedError:
        given = "a token that the server refused" if token else "no token"
        raise Unauthenticated(
            f"{location} wants a bearer token and this call had {given}: pass the server's token file "
            "with --auth-token-file"
        ) from None
    except flight.FlightUnavailableError as exc:
        raise StorageError(f"cannot reach a flightfeed server at {location}: {str(exc).splitlines()[0]}") from None
    except flight.FlightError as exc:
        raise StorageError(f"{location}: {str(exc).splitlines()[0]}") from None
    finally:
        client.close()
    if name and not datasets:
        known = ", ".join(i.descriptor.path[0].decode() for i in infos if i.descriptor.path) or "(none)"
        raise StorageError(f"{location} serves no dataset {name!r}; it serves: {known}")
    return {"target": target, "kind": "server", "location": location, "datasets": datasets}


def _schema(schema: Any) -> list[dict[str, str]]:
    return [{"name": f.name, "type": str(f.type)} for f in schema]


def format_report(report: dict[str, Any]) -> str:
    """The text form of an ``inspect_*`` report."""
    lines: list[str] = []
    if report["kind"] == "server":
        lines.append(f"server {report['location']}: {len(report['datasets'])} dataset(s)")
        for d in report["datasets"]:
            extra = "".join(f"  {k}: {d[k]}" for k in ("shards", "streams") if d.get(k) is not None)
            lines.append(f"\n{d['name']}  rows: {d['rows']:,}  bytes: {_size(d['bytes'])}{extra}")
            lines.extend(f"  {f['name']}: {f['type']}" for f in d["schema"])
            lines.extend(_classes(d.get("classes")))
        return "\n".join(lines)
    lines.append(f"dataset {report['target']}")
    lines.append(
        f"rows: {report['rows']:,}  shards: {report['shards']}  chunks: {report['chunks']}  "
        f"bytes: {_size(report['bytes'])}  compression: {report['compression']}"
    )
    lines.append("schema:")
    lines.extend(f"  {f['name']}: {f['type']}" for f in report["schema"])
    lines.extend(_classes(report.get("classes")))
    lines.append("shards:")
    shown = report["shard_list"][:20]
    marks = {True: "  ok (matches manifest)", False: "  MISMATCH (differs from manifest)", None: ""}
    for s in shown:
        lines.append(f"  {s['uri']}  rows: {s['rows']:,}  bytes: {_size(s['bytes'])}  chunks: {s['chunks']}")
        lines.extend(f"    {note}" for note in s.get("notes") or [])
        if s.get("sha256"):
            lines.append(f"    sha256: {s['sha256']}{marks[s.get('verified')]}")
    if len(report["shard_list"]) > len(shown):
        lines.append(f"  ... and {len(report['shard_list']) - len(shown)} more (--json lists all)")
    return "\n".join(lines)


def _classes(classes: list[str] | None, shown: int = 20) -> list[str]:
    """The ``classes:`` line (label i is classes[i]), for datasets that record class names."""
    if not classes:
        return []
    more = f" ... and {len(classes) - shown} more (--json lists all)" if len(classes) > shown else ""
    return [f"classes ({len(classes)}, label i = classes[i]): {', '.join(classes[:shown])}{more}"]


def _size(n: int) -> str:
    if n < 0:
        return "?"
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("KB", "MB", "GB"):
        value /= 1000
        if value < 1000:
            return f"{value:.1f} {unit}"
    return f"{value / 1000:.1f} TB"
