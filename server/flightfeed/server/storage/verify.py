"""Local shards checked against their dataset's ``manifest.json`` (``--verify startup|lazy|off``).

``flightfeed convert`` writes each shard's sha256 into the manifest. S3 shards are checked when the
cache downloads them; local shards are checked here:

* ``startup``: every shard is hashed before the server serves (a mismatch refuses to start);
* ``lazy`` (default): each shard is hashed once, in a background thread, when it is first read,
  so serving never waits for it (rows read before the hash finishes are served unverified);
* ``off``: no hashing.

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

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache_files import sha256_file
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest
from flightfeed.wire.errors import ConfigError, DatasetError

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
        self._thread: threading.Thread | None = None
        self.verified: set[int] = set()

    def verify_now(self) -> None:
        """Hash every listed shard now; raise DatasetError naming the first that differs."""
        for s in sorted(self.expected):
            problem = self._check(s)
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
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"flightfeed-verify-{self.ds.name}", daemon=True)
                self._thread.start()

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
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


def attach_verifier(ds: Dataset, mode: str, metrics: ServerMetrics | None = None) -> ShardVerifier | None:
    """Check ``ds`` (a local dataset) against its manifest as ``mode`` says; None without one."""
    if mode not in VERIFY_MODES:
        raise ConfigError(f"--verify {mode!r}: expected one of {', '.join(VERIFY_MODES)}")
    if mode == "off":
        return None
    found = local_manifest(ds.uri)
    if found is None:
        return None
    root, manifest = found
    entries = {os.path.normpath(os.path.join(root, e.name)): e for e in manifest.shards}
    expected: dict[int, tuple[str, str]] = {}
    for s, shard in enumerate(ds.shards):
        path = os.path.normpath(getattr(shard, "path", shard.uri))
        entry = entries.get(path)
        if entry is None:
            log.warning("dataset %r: shard %s is not in %s; it is not verified", ds.name, shard.uri, MANIFEST_NAME)
            continue
        size = os.path.getsize(path)
        if size != entry.bytes:
            raise DatasetError(
                f"dataset {ds.name!r}: shard {shard.uri} has {size} bytes, its manifest says {entry.bytes}; "
                "restore the shard, re-run `flightfeed convert`, or serve with --verify off"
            )
        expected[s] = (path, entry.sha256)
    verifier = ShardVerifier(ds, expected, metrics)
    if mode == "startup":
        verifier.verify_now()
    else:
        ds.on_first_read(verifier.touched)
    return verifier
