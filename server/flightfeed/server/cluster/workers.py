"""``--workers N``: the coordinator's worker processes, supervised.

Each worker is ``flightfeed serve`` on its own port (``--port 0``), started by a thread of its own
that reads the worker's ready line, then waits for it to exit: a dead worker is noticed at once
(and a hung one by the ``health`` check every ``check_interval`` s, killed after ``max_misses``
misses in a row). A dead worker is no longer listed (its endpoints go to the live processes) and
is restarted after a pause that doubles from ``backoff_s`` to ``backoff_cap_s`` (reset once a
worker has run ``stable_s`` seconds).

:meth:`WorkerPool.start` returns once every worker serves, and only then does the node print its
``flight:`` line. A worker killed by a signal before it first serves (the OOM killer, an operator's
``kill``) is restarted the same way; one that exits by itself before it first serves (a non-negative
exit code: its settings, which are the coordinator's, do not work) fails the start.

Workers watch their stdin, a pipe only the coordinator holds: when the coordinator dies, even by
``kill -9``, the pipe closes and the worker shuts itself down (``--exit-with-parent``).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flightfeed.server.cluster.health_probe import HealthProbe
from flightfeed.wire.errors import ConfigError

__all__ = ["WorkerPool", "READY_PREFIX", "CORES_PER_PROCESS", "default_workers"]

log = logging.getLogger("flightfeed.server")

READY_PREFIX = "flight: "

#: cores one serving process is given by default (``flightfeed serve`` without ``--workers``).
#: Within a process the hot stages run without the GIL, but not all of their time: measured on
#: one thread (``bench/bench_scaling.py``, thread CPU inside the GIL-free calls) the shuffled
#: gather is ~60% GIL-free and JPEG decode + augment ~89%, so by Amdahl one process gets ~1.4x /
#: ~1.8x from 2 cores but only ~1.8x / ~3.0x from 4. On the 16-core machine one process per 4
#: cores kept 12.4 of 16 cores busy decoding JPEGs (the Amdahl figure: 4 x 3.0), and 8 processes
#: x 2 threads decoded 1.5x the images of 4 x 4 (``bench/history.md``): one process per 2 cores.
#: More cores are put to work by more processes (each with its own GIL and h5py lock).
CORES_PER_PROCESS = 2


def default_workers(cores: int) -> int:
    """Serving processes for ``cores`` cores: one per ``CORES_PER_PROCESS`` (rounded up), so a
    1-2 core machine runs one process, a 4-core one two and a 16-core node eight."""
    return max(1, -(-max(1, cores) // CORES_PER_PROCESS))


@dataclass
class _Worker:
    index: int
    state: str = "starting"  # starting | live | restarting | stopped
    location: str | None = None
    proc: subprocess.Popen[str] | None = None
    restarts: int = 0
    started_at: float = 0.0
    last_check: float | None = None
    misses: int = 0
    last_error: str | None = None
    first_exit: int | None = None  # exit code of a worker that exited by itself before it ever served

    def describe(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state,
            "location": self.location,
            "pid": self.proc.pid if self.proc is not None else None,
            "restarts": self.restarts,
            "last_check": self.last_check,
            "last_error": self.last_error,
        }


class WorkerPool:
    """``n`` supervised worker processes running ``command`` (which must print ``flight: LOC``)."""

    def __init__(
        self,
        command: Sequence[str],
        n: int,
        *,
        check_interval: float = 1.0,
        max_misses: int = 3,
        backoff_s: float = 0.5,
        backoff_cap_s: float = 10.0,
        stable_s: float = 30.0,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
    ) -> None:
        self.command = list(command)
        self.check_interval, self.max_misses = check_interval, max_misses
        self.backoff_s, self.backoff_cap_s, self.stable_s = backoff_s, backoff_cap_s, stable_s
        self._token, self._roots = token, tls_root_certs
        self._workers = [_Worker(i) for i in range(n)]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._changed = threading.Condition(self._lock)

    # -- views ----------------------------------------------------------------------------
    def live(self) -> list[str]:
        """Locations of the workers serving now, in worker order."""
        with self._lock:
            return [w.location for w in self._workers if w.state == "live" and w.location]

    def all_live(self) -> bool:
        with self._lock:
            return all(w.state == "live" for w in self._workers)

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [w.describe() for w in self._workers]

    # -- lifecycle ------------------------------------------------------------------------
    def send_signal(self, signum: int) -> None:
        """Pass ``signum`` on to every running worker process (SIGHUP: reload the tenants)."""
        with self._lock:  # live ones only: one still starting may not handle the signal yet (it reads the file then)
            procs = [w.proc for w in self._workers if w.state == "live" and w.proc is not None]
        for proc in procs:
            with contextlib.suppress(OSError):  # it just exited: the pool restarts it with the file as it is now
                proc.send_signal(signum)

    def start(self, wait_s: float = 120.0) -> None:
        """Start every worker; return once all serve (ConfigError if one exits before serving)."""
        for w in self._workers:
            t = threading.Thread(target=self._keep, args=(w,), name=f"flightfeed-worker-{w.index}", daemon=True)
            t.start()
            self._threads.append(t)
        checker = threading.Thread(target=self._check_loop, name="flightfeed-worker-check", daemon=True)
        checker.start()
        self._threads.append(checker)
        deadline = time.monotonic() + wait_s
        with self._changed:
            while not all(w.state == "live" for w in self._workers):
                failed = [w for w in self._workers if w.first_exit is not None]
                if failed:
                    code = failed[0].first_exit
                    self._stop.set()
                    raise ConfigError(
                        f"worker process {failed[0].index} exited with code {code} before serving (its error is above)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    self._stop.set()
                    errors = "; ".join(f"worker {w.index}: {w.last_error}" for w in self._workers if w.last_error)
                    why = f" ({errors})" if errors else ""
                    raise ConfigError(f"worker processes did not start serving within {wait_s:g}s{why}")
                self._changed.wait(min(left, 0.5))

    def stop(self, grace: float) -> None:
        """SIGTERM every worker (they drain within their own ``--grace``); kill what remains."""
        self._stop.set()
        with self._lock:
            procs = [w.proc for w in self._workers if w.proc is not None]
        for p in procs:
            with contextlib.suppress(OSError):
                p.terminate()
        deadline = time.monotonic() + grace + 5.0
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    # -- supervision ----------------------------------------------------------------------
    def _set(self, w: _Worker, **fields: Any) -> None:
        with self._changed:
            for k, v in fields.items():
                setattr(w, k, v)
            self._changed.notify_all()

    def _keep(self, w: _Worker) -> None:
        """Run worker ``w``, restarting it with backoff until the pool stops."""
        delay = self.backoff_s
        served = False  # has this worker served once (then any death is restarted)
        while not self._stop.is_set():
            proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._set(w, proc=proc, state="starting", location=None, misses=0)
            location = None
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(READY_PREFIX):
                    location = line[len(READY_PREFIX) :].strip()
                    break
            if location is not None:
                self._set(w, state="live", location=location, started_at=time.monotonic())
                for _ in proc.stdout:  # keep the pipe drained; EOF: the worker is gone
                    pass
            code = proc.wait()
            if self._stop.is_set():
                self._set(w, state="stopped", location=None)
                return
            served = served or location is not None
            if not served and code >= 0:  # exited by itself before it ever served: its settings do not work
                self._set(w, state="stopped", first_exit=code)
                return
            if location is not None and time.monotonic() - w.started_at >= self.stable_s:
                delay = self.backoff_s
            error = f"exited with code {code}" + ("" if location is not None else " before serving")
            log.warning("worker %d (pid %d) %s; restarting it in %.1fs", w.index, proc.pid, error, delay)
            self._set(w, state="restarting", location=None, last_error=error)
            if self._stop.wait(delay):
                return
            delay = min(self.backoff_cap_s, delay * 2)
            self._set(w, restarts=w.restarts + 1)

    def _check_loop(self) -> None:
        probes: dict[str, HealthProbe] = {}
        while not self._stop.wait(self.check_interval):
            with self._lock:
                targets = [(w, w.location, w.proc) for w in self._workers if w.state == "live"]
            for w, location, proc in targets:
                if location is None or proc is None:
                    continue
                probe = probes.get(location)
                if probe is None:
                    probe = probes[location] = HealthProbe(
                        location, timeout_s=max(1.0, self.check_interval * 2), token=self._token,
                        tls_root_certs=self._roots,
                    )
                try:
                    probe.detail()
                    self._set(w, last_check=time.time(), misses=0)
                except Exception as exc:  # any failure is a missed check
                    misses = w.misses + 1
                    self._set(w, last_check=time.time(), misses=misses, last_error=f"health check: {exc}")
                    if misses >= self.max_misses and proc.poll() is None:
                        log.warning("worker %d (pid %d) missed %d health checks; killing it", w.index, proc.pid, misses)
                        proc.kill()
            for stale in set(probes) - {loc for _, loc, _ in targets}:
                probes.pop(stale).close()
