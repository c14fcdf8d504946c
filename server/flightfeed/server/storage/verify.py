"""Local shards checked against their dataset's ``manifest.json`` (``--verify startup|lazy|off``).

``flightfeed convert`` writes each shard's sha256 and the checksums of its ~8 MiB blocks into the
manifest (``readers.blocks``). S3 shards are checked when the cache downloads them (sha256) and
block by block when read; local shards are checked here:

* ``lazy`` (default): Arrow shards with block checksums are verified block by block the first time
  a record batch in the block is read, before any of its rows leave the node (a mismatch fails
  that read, naming the shard and block, and marks the dataset corrupt); shards without block
  checksums (older manifests, HDF5/Parquet) are hashed whole once, in a background thread, when
  first read (rows read before that hash ends are served unverified);
* ``startup``: every shard is verified before the server serves (a mismatch refuses to start);
* ``off``: no verification.

A shard whose sizes differ from the manifest is refused at open (in ``startup`` and ``lazy``). A
hash mismatch found while serving marks the dataset corrupt: its streams fail with a ShardError
naming the shard and both hashes, and the event is logged and counted
(``flightfeed_verify_failures_total``; verified shards: ``flightfeed_shards_verified_total``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from flightfeed.server.cores import available_cores
from flightfeed.server.data.catalog import Dataset
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.blocks import BlockCheck
from flightfeed.server.storage.cache.files import sha256_file
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest
from flightfeed.wire.errors import ConfigError, DatasetError, ShardError

__all__ = ["VERIFY_MODES", "attach_verifier", "local_manifest", "ShardVerifier"]

log = logging.getLogger("flightfeed.server")

VERIFY_MODES = ("startup", "lazy", "off")


def local_manifest(uri: str) -> tuple[str, Manifest] | None:
    """``(root, manifest)`` when the local dataset directory ``uri`` holds a manifest.json."""
    root = uri[len("file://") :] if uri.startswith("file://") else uri
    path = os.path.join(root, MANIFEST_NAME)
    if not os.path.isdir(root) or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return root, Manifest.from_json(f.read(), path)


class ShardVerifier:
    """Hashes the shards of one dataset that the manifest lists (``expected``: shard index ->
    (path, sha256)); lazily from a thread that runs only while there is work."""

    def __init__(self, ds: Dataset, expected: dict[int, tuple[str, str]], metrics: ServerMetrics | None) -> None:
        self.ds = ds
        self.expected = expected
        self.metrics = metrics
        self._lock = threading.Lock()
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()
        self._threads = 0  # hashing threads running (one per core at most: hashlib releases the GIL)
        self.max_threads = available_cores()
        self.verified: set[int] = set()

    def verify_now(self) -> None:
        """Hash every listed shard now (one thread per core); raise DatasetError naming the first
        that differs."""
        shards = sorted(self.expected)
        with ThreadPoolExecutor(max(1, min(self.max_threads, len(shards))), "flightfeed-verify") as pool:
            problems = list(pool.map(self._check, shards))
        for problem in problems:
            if problem is not None:
                raise DatasetError(
                    f"{problem}; restore the shard, re-run `flightfeed convert`, or serve with --verify off"
                )

    def touched(self, s: int) -> None:
        """Shard ``s`` is read for the first time: hash it in the background (once)."""
        with self._lock:
            if s not in self.expected or s in self._queued:
                return
            self._queued.add(s)
            self._queue.append(s)
            if self._threads >= self.max_threads:
                return
            self._threads += 1
        name = f"flightfeed-verify-{self.ds.name}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def running(self) -> bool:
        with self._lock:
            return self._threads > 0

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._threads -= 1
                    return
                s = self._queue.popleft()
            problem = self._check(s)
            if problem is not None:
                self.ds.mark_corrupt(problem)

    def _check(self, s: int) -> str | None:
        path, expected = self.expected[s]
        try:
            got = sha256_file(path)
        except OSError as exc:
            got = f"unreadable ({exc})"
        if got == expected:
            self.verified.add(s)
            if self.metrics is not None:
                self.metrics.io.shards_verified.labels(self.ds.name).inc()
            return None
        if self.metrics is not None:
            self.metrics.io.verify_failures.labels(self.ds.name).inc()
        problem = f"shard {self.ds.shards[s].uri} does not match its manifest (sha256 {got}, manifest {expected})"
        log.error("dataset %r: %s", self.ds.name, problem)
        return problem


def attach_verifier(
    ds: Dataset,
    mode: str,
    metrics: ServerMetrics | None = None,
    *,
    found: tuple[str, Manifest] | None = None,
    look: bool = True,
) -> ShardVerifier | None:
    """Check ``ds`` (a local dataset) against its manifest as ``mode`` says; None without one.
    ``found``: the manifest already read (``look=False``: none was found), else it is read here."""
    if mode not in VERIFY_MODES:
        raise ConfigError(f"--verify {mode!r}: expected one of {', '.join(VERIFY_MODES)}")
    if mode == "off":
        return None
    if found is None and look:
        found = local_manifest(ds.uri)
    if found is None:
        log.info(
            "dataset %r has no %s: its bytes are not verified; write one with `flightfeed inspect %s "
            "--write-manifest`", ds.name, MANIFEST_NAME, ds.uri,
        )
        return None
    root, manifest = found
    entries = {os.path.normpath(os.path.join(root, e.name)): e for e in manifest.shards}
    expected: dict[int, tuple[str, str]] = {}
    checks: list[BlockCheck] = []
    for s, shard in enumerate(ds.shards):
        path = os.path.normpath(getattr(shard, "path", shard.uri))
        entry = entries.get(path)
        if entry is None:
            log.warning("dataset %r: shard %s is not in %s; it is not verified", ds.name, shard.uri, MANIFEST_NAME)
            continue
        size = shard.nbytes  # the file's size when it was listed (a change later is caught on open)
        if size != entry.bytes:
            raise DatasetError(
                f"dataset {ds.name!r}: shard {shard.uri} has {size} bytes, its manifest says {entry.bytes}; "
                "restore the shard, re-run `flightfeed convert`, or serve with --verify off"
            )
        verify_blocks = getattr(shard, "verify_blocks", None)
        if entry.blocks is not None and verify_blocks is not None:
            checks.append(verify_blocks(entry.blocks))
            if metrics is not None:
                checks[-1].on_failure(lambda _reason: metrics.io.verify_failures.labels(ds.name).inc())
        else:
            expected[s] = (path, entry.sha256)
    if expected and len(expected) == len(ds.shards) and mode == "lazy":
        log.warning(
            "dataset %r: %s has no block checksums, so rows are served before each shard's background hash "
            "ends; re-write it with `flightfeed inspect %s --write-manifest`", ds.name, MANIFEST_NAME, ds.uri,
        )
    verifier = ShardVerifier(ds, expected, metrics)
    if mode == "startup":
        _verify_blocks_now(ds, checks, metrics)
        verifier.verify_now()
    else:
        ds.on_first_read(verifier.touched)
    return verifier


def _verify_blocks_now(ds: Dataset, checks: list[BlockCheck], metrics: ServerMetrics | None) -> None:
    for check in checks:
        try:
            check.ensure_all()
        except ShardError as exc:
            why = f"{exc}; restore the shard, re-run `flightfeed convert`, or serve with --verify off"
            raise DatasetError(why) from None
        if metrics is not None:
            metrics.io.shards_verified.labels(ds.name).inc()
