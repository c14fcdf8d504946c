"""``flightfeed serve``'s run: open the catalog, bound open files, start the worker processes, the
Flight server and the sidecar, serve until SIGINT/SIGTERM, then drain (see the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
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
from flightfeed.server.guards.tenants.ledger import TenantLedger, node_ledger_path
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.open_files import MIN_OPEN, default_max_open, raise_nofile_limit, shared_open_files
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.request.shared_messages import DEFAULT_SHARE_WINDOW
from flightfeed.server.request.streaming import StreamSettings
from flightfeed.server.serve.args import add_arguments, parse_datasets, setting, worker_argv
from flightfeed.server.serve.config_file import load_config, merge_config
from flightfeed.server.serve.tenants_setup import forward_sighup, setup_tenants
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.storage.cli_options import (
    apply_config,
    parse_size,
    storage_options_from_args,
)
from flightfeed.server.transforms.setup import transformer_from_config
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import read_token_file

__all__ = ["run"]

log = logging.getLogger("flightfeed.server")

#: the longest --grace (a week): a longer wait overflows the platform's time_t at SIGTERM
MAX_GRACE_S = 7 * 24 * 3600


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


def _tenant_ledger(args: argparse.Namespace, config: dict[str, Any], workers: int) -> TenantLedger | None:
    """The node's tenants ledger (docs/security.md): a worker process joins its coordinator's; a
    coordinator of several processes makes one (in ``--ledger-dir``); one process keeps none."""
    path = getattr(args, "tenant_ledger", None)
    folder = setting(args, config, "ledger_dir", None)
    if path is None and workers == 1:
        return None
    try:
        return TenantLedger(str(path or node_ledger_path(str(folder) if folder is not None else None)))
    except OSError as exc:
        where = path or folder or "the temporary directory"
        raise ConfigError(f"--ledger-dir: cannot make the tenants ledger in {where}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    flags = argparse.ArgumentParser(add_help=False)
    add_arguments(flags)
    merge_config(args, config, args.config, flags)  # every setting of the file, as its flag would give it
    datasets = parse_datasets(list(args.datasets) or [f"{k}={v}" for k, v in config.get("datasets", {}).items()])
    if not datasets:
        raise ConfigError("no datasets: give NAME=URI arguments (e.g. flightfeed serve train=/data/train)")
    host = setting(args, config, "host", "127.0.0.1")
    port = int(setting(args, config, "port", 8815))
    sidecar_port = int(setting(args, config, "sidecar_port", 8816))
    for flag, value in (("--port", port), ("--sidecar-port", sidecar_port)):
        if not 0 <= value <= 65535:
            raise ConfigError(f"{flag} {value}: must be a TCP port, 0-65535 (0 picks a free one)")
    cores = available_cores()
    workers = int(setting(args, config, "workers", default_workers(cores)))
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be >= 1")
    grace = float(setting(args, config, "grace", 30.0))
    if not 0 <= grace <= MAX_GRACE_S:  # inf (and 1e10) crashed at SIGTERM with OverflowError; nan is refused too
        raise ConfigError(f"--grace {grace}: must be a finite number of seconds from 0 to {MAX_GRACE_S} (default 30)")
    peers = parse_peers(str(setting(args, config, "peers", "")))
    peers_dns = setting(args, config, "peers_dns", None)
    dns = parse_peers_dns(str(peers_dns)) if peers_dns else None
    if args.exit_with_parent:
        exit_with_parent()
    options = storage_options_from_args(args, os.environ)
    apply_config(options, args, config)
    token_file = setting(args, config, "auth_token_file", None)
    token = read_token_file(token_file) if token_file else None
    tenants = setup_tenants(setting(args, config, "tenants", None), token, token_file, os.environ)
    token = tenants.token  # the operator's: the node's own calls (workers, peers, the sidecar)
    args.operator_token_file = tenants.token_file
    cluster_token_file = setting(args, config, "cluster_token_file", None)
    key = read_cluster_key(str(cluster_token_file), token) if cluster_token_file else None
    if key is not None and tenants.registry is not None and tenants.registry.identify(
        read_token_file(str(cluster_token_file), "--cluster-token-file").encode()
    ) is not None:
        raise ConfigError(
            f"--cluster-token-file {cluster_token_file} holds a tenant's token: only data nodes may hold the "
            "membership credential; give the nodes a secret of their own (e.g. `openssl rand -hex 32`)"
        )
    clustered = bool(peers or dns or key)  # with a credential, a node alone may be joined by others
    if clustered and tenants.registry is not None and token_file is None:
        raise ConfigError(
            "--tenants with peers: give every data node the same --auth-token-file (the operator token the "
            "nodes use between themselves; tenants' tokens never are), e.g. from `openssl rand -hex 32`"
        )
    locality = clustered and not args.no_cache_locality
    if locality:  # shards come on first read, through their preferred node (not all at startup)
        options.s3_prefetch = False
    metrics = ServerMetrics()
    options.metrics = metrics
    _bound_open_files(setting(args, config, "max_open_shards", None), metrics)
    options.verify = str(setting(args, config, "verify", "lazy"))
    options.arrow_io = str(setting(args, config, "arrow_io", "mmap"))
    options.small_shard_bytes = int(setting(args, config, "small_shard_size", options.small_shard_bytes))
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        tls = [check_tls_files(args.tls_cert, args.tls_key)]
    settings = StreamSettings(
        message_bytes=int(setting(args, config, "message_size", 16 << 20)),
        readahead_windows=int(setting(args, config, "read_ahead", 1)),
    )
    if settings.message_bytes < 1:
        raise ConfigError(f"--message-size {settings.message_bytes}: must be >= 1 byte (default 16MiB)")
    if settings.readahead_windows < 0:
        raise ConfigError(f"--read-ahead {settings.readahead_windows}: must be >= 0 (0 turns read-ahead off)")
    decode_workers = setting(args, config, "decode_workers", None)
    if decode_workers is None:  # the process's share of the cores (--workers' processes get the same)
        decode_workers = -(-cores // workers)
    transformer = transformer_from_config(config, int(decode_workers), metrics)
    max_streams = int(setting(args, config, "max_streams", DEFAULT_MAX_STREAMS))
    if max_streams < 1:
        raise ConfigError(f"--max-streams {max_streams}: must be >= 1 (default {DEFAULT_MAX_STREAMS})")
    limits = Limits(message_bytes=settings.message_bytes, max_streams=max_streams)
    budget = BytesInFlight(
        int(setting(args, config, "max_bytes_in_flight", DEFAULT_BYTES_IN_FLIGHT)),
        int(setting(args, config, "client_bytes_in_flight", DEFAULT_CLIENT_BYTES_IN_FLIGHT)),
        metrics=metrics,
    )
    window_setting = setting(args, config, "share_window", DEFAULT_SHARE_WINDOW)
    share_window = parse_size(window_setting) if isinstance(window_setting, str) else int(window_setting)
    if share_window < 0:
        raise ConfigError(f"--share-window {share_window}: must be >= 0 bytes (0 turns shared jobs off)")
    fair_slots = int(setting(args, config, "fair_slots", decode_workers))
    if fair_slots < 0:
        raise ConfigError(f"--fair-slots {fair_slots}: must be >= 0 (0 turns fair queueing off)")
    ledger = _tenant_ledger(args, config, workers) if tenants.registry is not None else None
    sidecar_host = str(setting(args, config, "sidecar_host", "127.0.0.1"))
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
            tenants=tenants.registry,
            fair_slots=fair_slots,
            ledger=ledger,
            transformer=transformer,
            limits=limits,
            bytes_in_flight=budget,
            share_window=share_window,
        )
        cluster = server.cluster
        roots = tls[0][0] if tls else None
        if workers > 1:
            command = [sys.executable, "-m", "flightfeed.server", "serve", *worker_argv(args, datasets, host)]
            command += ["--workers", "1", "--no-sidecar", "--port", "0", "--grace", str(grace), "--exit-with-parent"]
            if getattr(args, "decode_workers", None) is None:
                command += ["--decode-workers", str(decode_workers)]
            if ledger is not None:  # the tenants' limits and shares are the node's
                command += ["--tenant-ledger", ledger.path]
            cluster.workers = WorkerPool(command, workers - 1, token=token, tls_root_certs=roots)
            cluster.workers.start()
            if tenants.registry is not None:  # SIGHUP reloads the tenants here and in every worker
                forward_sighup(tenants.registry, cluster.workers)
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
        port = int(setting(args, config, "sidecar_port", 8816))
        handle = start_sidecar(source, sidecar_host, port, token=token, tenants=server.tenants)
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
