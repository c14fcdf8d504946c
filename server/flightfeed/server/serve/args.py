"""The command line of ``flightfeed serve``: its flags, the ``NAME=URI`` arguments, the ``--config``
file (TOML or JSON, the same settings; flags win) and the flags a ``--workers`` process is given.

``serve.command.run`` reads a setting as ``setting(args, config, key, default)``: the flag when given, else
the config file's ``key`` (``_`` or ``-``), else the default (``serve.config_file.merge_config`` has
already set every flag the command line left unset from the file, converted and checked).
"""

from __future__ import annotations

import argparse
from typing import Any

from flightfeed.server.storage.cli_options import (
    add_cache_arguments,
    add_chunk_cache_argument,
    add_reader_arguments,
    add_s3_arguments,
    size_argument,
)
from flightfeed.wire.errors import ConfigError

__all__ = ["add_arguments", "parse_datasets", "setting", "worker_argv"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="*", metavar="NAME=URI", help="dataset name and directory, glob or s3:// URI")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="Flight port (default 8815; 0 picks a free one)")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--sidecar-port", type=int, default=None, help="metrics sidecar port (default 8816)")
    side.add_argument("--no-sidecar", action="store_true", help="do not start the metrics sidecar")
    p.add_argument(
        "--workers", type=int, default=None,
        help="processes serving streams (default: one per 2 cores given, rounded up: 1 on 1-2 cores, 8 on 16)",
    )
    p.add_argument("--config", metavar="FILE", help="TOML or JSON file with the same settings (flags win)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate chain (serve grpc+tls)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key")
    p.add_argument("--auth-token-file", metavar="FILE", help="require 'authorization: Bearer <token in FILE>'")
    p.add_argument(
        "--tenants", metavar="FILE", default=None,
        help="TOML file of tenants: each one's token, datasets (names or globs), weight, max_streams, "
        "max_bytes_per_s; reloaded on SIGHUP or a change of the file (docs/security.md)",
    )
    p.add_argument(
        "--fair-slots", type=int, default=None, metavar="N",
        help="with --tenants: messages made at once under the weighted fair queue (default: the process's "
        "decode threads, i.e. its cores; 0: no fair queueing)",
    )
    p.add_argument(
        "--ledger-dir", default=None, metavar="DIR",
        help="with --tenants and --workers > 1: where the node's processes keep the tenants' node-wide "
        "ledger (max_streams, max_bytes_per_s, fair shares), in a folder of this node's own, removed at "
        "exit (default: the system's temporary directory)",
    )
    p.add_argument("--tenant-ledger", default=None, help=argparse.SUPPRESS)  # --workers' processes: the node's
    p.add_argument(
        "--insecure", action="store_true",
        help="no warning for a non-loopback --host without --auth-token-file or TLS",
    )
    p.add_argument("--sidecar-host", default=None, help="address the sidecar binds (default 127.0.0.1)")
    p.add_argument("--max-streams", type=int, default=None, help="streams one request may ask for (default 32)")
    p.add_argument(
        "--max-bytes-in-flight", type=size_argument, default=None,
        help="bytes of messages in flight over all clients before streams wait (default 512MiB; 0: no limit)",
    )
    p.add_argument(
        "--client-bytes-in-flight", type=size_argument, default=None,
        help="the same for one client address (default 256MiB; 0: no limit)",
    )
    p.add_argument(
        "--message-size", type=size_argument, default=None, help="target bytes per Flight message (default 16MiB)"
    )
    p.add_argument(
        "--share-window", type=size_argument, default=None, metavar="BYTES",
        help="shared jobs: keep up to BYTES of produced messages (gathered, decoded, augmented) per server "
        "process for identical requests of other trainers (default 512MiB; 0: off)",
    )
    p.add_argument(
        "--decode-workers",
        type=int,
        default=None,
        help="threads decoding/transforming images for transform requests (default: the cores this process "
        "is given: its CPU affinity, capped by a cgroup CPU quota)",
    )
    p.add_argument(
        "--grace", type=float, default=None,
        help="seconds in-flight streams get at SIGTERM before they are cancelled (default 30)",
    )
    p.add_argument(
        "--peers", default=None, metavar="LOCATIONS",
        help="other data nodes serving the same datasets: grpc://host:port[,grpc://host:port...]",
    )
    p.add_argument(
        "--peers-dns", default=None, metavar="NAME:PORT",
        help="find peers as every address NAME resolves to (re-resolved; a Kubernetes headless Service)",
    )
    p.add_argument(
        "--cluster-token-file", default=None, metavar="FILE",
        help="a secret shared by the data nodes (not the trainers' token): nodes that prove it may join "
        "by gossip; without it the peers are exactly --peers/--peers-dns",
    )
    p.add_argument(
        "--no-cache-locality", action="store_true",
        help="with peers: fetch every shard from storage here (default: via the shard's preferred node)",
    )
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)  # --workers' processes
    p.add_argument(
        "--verify",
        choices=("startup", "lazy", "off"),
        default=None,
        help="check local shards against manifest.json: all before serving, each on first read "
        "in the background (default: lazy), or not at all",
    )
    p.add_argument(
        "--arrow-io",
        choices=("mmap", "read"),
        default=None,
        help="local .arrow shards: memory-mapped under a read lease (default) or read with positioned "
        "reads (one copy; for filesystems without leases)",
    )
    p.add_argument(
        "--read-ahead",
        type=int,
        default=None,
        metavar="WINDOWS",
        help="shuffle windows read ahead of each stream (default 1; 0: no read-ahead)",
    )
    p.add_argument(
        "--max-open-shards",
        type=int,
        default=None,
        metavar="N",
        help="shard files open at once (least recently used closed past it; default: the open-file "
        "limit less a quarter, at least 256 descriptors, kept for sockets and the rest)",
    )
    p.add_argument(
        "--small-shard-size",
        type=size_argument,
        default=None,
        metavar="BYTES",
        help="local .arrow shards up to this size are read whole into memory when opened instead of "
        "memory-mapped (default 1MiB; 0 maps every shard)",
    )
    add_s3_arguments(p)
    add_cache_arguments(p)
    add_reader_arguments(p)
    add_chunk_cache_argument(p)


def parse_datasets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, uri = item.partition("=")
        if not sep or not name or not uri:
            raise ConfigError(f"dataset {item!r}: expected NAME=URI, e.g. train=/data/train or train=s3://bucket/train")
        if name in out:
            raise ConfigError(f"dataset name {name!r} is given twice")
        out[name] = uri
    return out


def setting(args: argparse.Namespace, config: dict[str, Any], key: str, default: Any) -> Any:
    value = getattr(args, key, None)
    if value is not None:
        return value
    return config.get(key, config.get(key.replace("_", "-"), default))


def worker_argv(args: argparse.Namespace, datasets: dict[str, str], host: str) -> list[str]:
    """The flags a worker process needs: the datasets and the storage/TLS/auth settings."""
    out = [f"{k}={v}" for k, v in datasets.items()] + ["--host", host, "--insecure"]  # the coordinator warns
    flags = {
        "--config": args.config,
        "--s3-endpoint": getattr(args, "s3_endpoint", None),
        "--s3-region": getattr(args, "s3_region", None),
        "--cache-dir": getattr(args, "cache_dir", None),
        "--cache-size": getattr(args, "cache_size", None),
        "--s3-reads": getattr(args, "s3_reads", None),
        "--s3-range-shard-bytes": getattr(args, "s3_range_shard_bytes", None),
        "--chunk-cache": getattr(args, "chunk_cache", None),
        "--message-size": args.message_size,
        "--share-window": getattr(args, "share_window", None),
        "--decode-workers": getattr(args, "decode_workers", None),
        "--max-streams": getattr(args, "max_streams", None),
        "--max-bytes-in-flight": getattr(args, "max_bytes_in_flight", None),
        "--client-bytes-in-flight": getattr(args, "client_bytes_in_flight", None),
        "--read-ahead": args.read_ahead,
        "--verify": args.verify,
        "--arrow-io": args.arrow_io,
        "--max-open-shards": getattr(args, "max_open_shards", None),
        "--small-shard-size": getattr(args, "small_shard_size", None),
        "--tls-cert": args.tls_cert,
        "--tls-key": args.tls_key,
        "--auth-token-file": getattr(args, "operator_token_file", None) or args.auth_token_file,
        "--tenants": getattr(args, "tenants", None),
        "--fair-slots": getattr(args, "fair_slots", None),
    }
    for flag, value in flags.items():
        if value is not None:
            out += [flag, str(value)]
    for cast in getattr(args, "cast", None) or []:
        out += ["--cast", cast]
    for group in getattr(args, "hdf5_group", None) or []:
        out += ["--hdf5-group", group]
    for picked in getattr(args, "hdf5_columns", None) or []:
        out += ["--hdf5-columns", picked]
    return out
