"""``flightfeed serve NAME=URI ...``: open the datasets, serve them over Flight (plus the sidecar)
until SIGINT/SIGTERM, then shut down gracefully (in-flight streams get ``--grace`` seconds).

With no tuning flags the node uses every core it is given (``cores.available_cores``): one
serving process per 2 cores (``cluster.workers.default_workers``: one process on 1-2 cores), each
stream on its own gRPC thread with the hot stages (stored send, shuffled gather, HDF5 inflate,
image decode, block verification) in native code without the GIL, and each process's decode pool
sized to its share of the cores.

``--workers N`` starts N-1 supervised worker processes serving the same datasets on their own
ports (restarted with backoff when they die; they exit when this process dies); ``--peers`` /
``--peers-dns`` name the other data nodes. ``get_flight_info`` spreads endpoints over every live
process of every live node (``flightfeed.server.cluster``), so streams spread over the GILs and
h5py locks of all of them, and a client continues a failed stream on the next location.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

from flightfeed.server.cluster import (
    READY_PREFIX,
    Membership,
    WorkerPool,
    default_workers,
    parse_peers,
    parse_peers_dns,
)
from flightfeed.server.cluster.credential import read_cluster_key
from flightfeed.server.cluster.lifecycle import drain_and_exit, exit_with_parent, install_signals, wait_for
from flightfeed.server.cluster.locality import ShardRouter
from flightfeed.server.cores import available_cores
from flightfeed.server.data.catalog import Catalog
from flightfeed.server.guards.budget import DEFAULT_BYTES_IN_FLIGHT, DEFAULT_CLIENT_BYTES_IN_FLIGHT, BytesInFlight
from flightfeed.server.guards.exposure import warn_if_exposed
from flightfeed.server.guards.limits import DEFAULT_MAX_STREAMS, Limits
from flightfeed.server.guards.listen import check_tls_files
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.open_files import MIN_OPEN, default_max_open, raise_nofile_limit, shared_open_files
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.request.shared_messages import DEFAULT_SHARE_WINDOW
from flightfeed.server.request.streaming import StreamSettings
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.storage.cli_options import (
    add_cache_arguments,
    add_chunk_cache_argument,
    add_reader_arguments,
    add_s3_arguments,
    apply_config,
    parse_size,
    size_argument,
    storage_options_from_args,
)
from flightfeed.server.transforms.setup import transformer_from_config
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import read_token_file

__all__ = ["add_arguments", "run", "parse_datasets"]

log = logging.getLogger("flightfeed.server")

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


def _load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    text = Path(path).read_bytes()
    try:
        data: dict[str, Any] = json.loads(text) if path.endswith(".json") else tomllib.loads(text.decode())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot parse ({exc})") from None
    return data


def _setting(args: argparse.Namespace, config: dict[str, Any], key: str, default: Any) -> Any:
    value = getattr(args, key, None)
    if value is not None:
        return value
    return config.get(key, config.get(key.replace("_", "-"), default))


def _open_catalog(datasets: dict[str, str], options: StorageOptions) -> Catalog:
    catalog = open_catalog(datasets, options)
    for ds in catalog.datasets():
        print(
            f"dataset {ds.name}: {ds.num_rows:,} rows in {len(ds.shards)} shard(s), "
            f"{ds.nbytes / 1e9:.2f} GB, fingerprint {ds.fingerprint}  ({ds.uri})",
            flush=True,
        )
    return catalog


def _bound_open_files(max_open: Any, metrics: ServerMetrics) -> None:
    """Raise the soft open-file limit to the hard one and size the bound on open shards from it
    (or from ``--max-open-shards``); say what was set."""
    before, after = raise_nofile_limit()
    files = shared_open_files()
    if max_open is not None:
        if int(max_open) < MIN_OPEN:
            raise ConfigError(f"--max-open-shards {max_open}: must be >= {MIN_OPEN}")
        files.set_limit(int(max_open))
    else:
        files.set_limit(default_max_open(after))
    raised = f"raised from {before}" if after != before else "unchanged"
    print(f"open files: limit {after} ({raised}); at most {files.limit} shard file(s) open at once", flush=True)
    if max_open is not None and int(max_open) > after - 64:
        log.warning("--max-open-shards %s leaves little of the open-file limit %s for sockets", max_open, after)
    metrics.sections["open_files"] = files.snapshot


def _worker_argv(args: argparse.Namespace, datasets: dict[str, str], host: str) -> list[str]:
    """The flags a worker process needs: the datasets and the storage/TLS/auth settings."""
    out = [f"{k}={v}" for k, v in datasets.items()] + ["--host", host, "--insecure"]  # the coordinator warns
    flags = {
        "--config": args.config,
        "--s3-endpoint": getattr(args, "s3_endpoint", None),
        "--s3-region": getattr(args, "s3_region", None),
        "--cache-dir": getattr(args, "cache_dir", None),
        "--cache-size": getattr(args, "cache_size", None),
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
        "--auth-token-file": args.auth_token_file,
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


def run(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    datasets = parse_datasets(list(args.datasets) or [f"{k}={v}" for k, v in config.get("datasets", {}).items()])
    if not datasets:
        raise ConfigError("no datasets: give NAME=URI arguments (e.g. flightfeed serve train=/data/train)")
    host = _setting(args, config, "host", "127.0.0.1")
    port = int(_setting(args, config, "port", 8815))
    cores = available_cores()
    workers = int(_setting(args, config, "workers", default_workers(cores)))
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be >= 1")
    grace = float(_setting(args, config, "grace", 30.0))
    if grace < 0:
        raise ConfigError(f"--grace {grace}: must be >= 0 seconds")
    peers = parse_peers(str(_setting(args, config, "peers", "")))
    peers_dns = _setting(args, config, "peers_dns", None)
    dns = parse_peers_dns(str(peers_dns)) if peers_dns else None
    if args.exit_with_parent:
        exit_with_parent()
    options = storage_options_from_args(args, os.environ)
    apply_config(options, args, config)
    token_file = _setting(args, config, "auth_token_file", None)
    token = read_token_file(token_file) if token_file else None
    cluster_token_file = _setting(args, config, "cluster_token_file", None)
    key = read_cluster_key(str(cluster_token_file), token) if cluster_token_file else None
    clustered = bool(peers or dns or key)  # with a credential, a node alone may be joined by others
    locality = clustered and not args.no_cache_locality
    if locality:  # shards come on first read, through their preferred node (not all at startup)
        options.s3_prefetch = False
    metrics = ServerMetrics()
    options.metrics = metrics
    _bound_open_files(_setting(args, config, "max_open_shards", None), metrics)
    options.verify = str(_setting(args, config, "verify", "lazy"))
    options.arrow_io = str(_setting(args, config, "arrow_io", "mmap"))
    options.small_shard_bytes = int(_setting(args, config, "small_shard_size", options.small_shard_bytes))
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        tls = [check_tls_files(args.tls_cert, args.tls_key)]
    settings = StreamSettings(
        message_bytes=int(_setting(args, config, "message_size", 16 << 20)),
        readahead_windows=int(_setting(args, config, "read_ahead", 1)),
    )
    if settings.readahead_windows < 0:
        raise ConfigError(f"--read-ahead {settings.readahead_windows}: must be >= 0 (0 turns read-ahead off)")
    decode_workers = _setting(args, config, "decode_workers", None)
    if decode_workers is None:  # the process's share of the cores (--workers' processes get the same)
        decode_workers = -(-cores // workers)
    transformer = transformer_from_config(config, int(decode_workers), metrics)
    limits = Limits(
        message_bytes=settings.message_bytes,
        max_streams=int(_setting(args, config, "max_streams", DEFAULT_MAX_STREAMS)),
    )
    budget = BytesInFlight(
        int(_setting(args, config, "max_bytes_in_flight", DEFAULT_BYTES_IN_FLIGHT)),
        int(_setting(args, config, "client_bytes_in_flight", DEFAULT_CLIENT_BYTES_IN_FLIGHT)),
        metrics=metrics,
    )
    window_setting = _setting(args, config, "share_window", DEFAULT_SHARE_WINDOW)
    share_window = parse_size(window_setting) if isinstance(window_setting, str) else int(window_setting)
    if share_window < 0:
        raise ConfigError(f"--share-window {share_window}: must be >= 0 bytes (0 turns shared jobs off)")
    sidecar_host = str(_setting(args, config, "sidecar_host", "127.0.0.1"))
    if not (args.insecure or config.get("insecure", False)):
        sidecar_on = not (args.no_sidecar or config.get("no_sidecar", False))
        shown_sidecar = sidecar_host if sidecar_on else None
        warn_if_exposed(host, shown_sidecar, has_token=token is not None, has_tls=tls is not None)
    catalog = _open_catalog(datasets, options)
    if not args.exit_with_parent:
        print(f"cores: {cores}; serving processes: {workers}; decode threads per process: {decode_workers}", flush=True)
    scheme = "grpc+tls" if tls else "grpc"
    stop = threading.Event()
    install_signals(stop)  # before anything is announced: a SIGTERM now is a clean shutdown
    server: FlightFeedServer | None = None
    try:
        server = FlightFeedServer(
            catalog,
            f"{scheme}://{host}:{port}",
            metrics=metrics,
            settings=settings,
            tls_certificates=tls,
            auth_token=token,
            transformer=transformer,
            limits=limits,
            bytes_in_flight=budget,
            share_window=share_window,
        )
        cluster = server.cluster
        roots = tls[0][0] if tls else None
        if workers > 1:
            command = [sys.executable, "-m", "flightfeed.server", "serve", *_worker_argv(args, datasets, host)]
            command += ["--workers", "1", "--no-sidecar", "--port", "0", "--grace", str(grace), "--exit-with-parent"]
            if getattr(args, "decode_workers", None) is None:
                command += ["--decode-workers", str(decode_workers)]
            cluster.workers = WorkerPool(command, workers - 1, token=token, tls_root_certs=roots)
            cluster.workers.start()
        if clustered:
            cluster.membership = Membership(
                cluster.me, cluster.datasets, static=peers, dns=dns, scheme=scheme, token=token, tls_root_certs=roots,
                key=key,
            )
            cluster.start()
        router = ShardRouter(cluster, route=locality, token=token, tls_root_certs=roots)
        if router.install(catalog):  # remote shards: count S3 bytes; with peers, route them
            cluster.locality = router
        return _serve(server, args, config, sidecar_host, token, stop, grace)
    finally:
        if server is not None:
            server.cluster.stop(0.0)  # idempotent: what a failed start left running
        catalog.close()


def _serve(
    server: FlightFeedServer,
    args: argparse.Namespace,
    config: dict[str, Any],
    sidecar_host: str,
    token: str | None,
    stop: threading.Event,
    grace: float,
) -> int:
    handle: Any = None
    source: Any = None
    if not args.no_sidecar and not config.get("no_sidecar", False):
        from flightfeed.server.sidecar import LocalSource, start_sidecar

        source = LocalSource(server.metrics, server.catalog, server.location, token=token)
        pool = server.cluster.workers
        if pool is not None:  # --workers N: merge every live worker process's figures
            from flightfeed.server.sidecar.aggregate import AggregateSource

            source = AggregateSource(source, pool.live, token=token)
        handle = start_sidecar(source, sidecar_host, int(_setting(args, config, "sidecar_port", 8816)), token=token)
    print(f"{READY_PREFIX}{server.location}", flush=True)
    if handle is not None:
        print(f"sidecar: {handle.url}", flush=True)
    wait_for(stop)
    cluster = server.cluster
    stopping: list[threading.Thread] = []

    def before() -> None:
        cluster.drain()  # /readyz unready, out of new FlightInfos, peers see "draining"
        t = threading.Thread(target=cluster.stop, args=(grace,), name="flightfeed-stop-cluster", daemon=True)
        t.start()  # workers drain in parallel, within the same grace
        stopping.append(t)

    def cleanup() -> None:
        if cluster.workers is not None:
            cluster.workers.stop(0.0)
        if handle is not None:
            handle.stop()

    def busy() -> bool:  # a stream in flight: a reader may ask for its next run of messages
        return any(s.value > 0 for family in server.metrics.streams_active.collect() for s in family.samples)

    drain_and_exit(server, grace, before=before, cleanup=cleanup, busy=busy)
    for t in stopping:
        t.join(timeout=grace + 10)
    if handle is not None:
        handle.stop()
    if source is not None:
        source.close()
    return 0
