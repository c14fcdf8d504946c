"""Trainer-side reporting: every few seconds, send the reader's stall and throughput figures to
the server (Flight action ``report``, body = a ``flightfeed.v1.ClientReport``), so the data
node's sidecar shows whether its trainers are starved.

Reporting never hurts the trainer: it runs on its own daemon thread over its own FlightClient,
and every failure (server gone, figures() raising, a bad value) is counted and logged at debug
level, never raised.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow.flight as flight

from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._options import ConnectOptions
from flightfeed.wire.messages import ClientReport

__all__ = ["Reporter", "report_message", "start_reporter"]

log = logging.getLogger("flightfeed.client.report")

# StallMeter.figures() names -> ClientReport fields
_ALIASES = {"rows": "rows_total", "bytes": "bytes_total"}
_FIELDS = {f.name: f for f in ClientReport.DESCRIPTOR.fields}


def _default_client_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def report_message(figures: Mapping[str, Any]) -> Any:
    """A ClientReport from ClientReport field names (or StallMeter names ``rows``/``bytes``);
    unknown keys are ignored, numbers are coerced to the field's type (non-finite -> 0)."""
    msg = ClientReport()
    for key, value in figures.items():
        name = _ALIASES.get(key, key)
        fd = _FIELDS.get(name)
        if fd is None or value is None:
            continue
        if fd.type == fd.TYPE_STRING:
            setattr(msg, name, str(value))
        elif fd.type == fd.TYPE_DOUBLE:
            f = float(value)
            setattr(msg, name, f if math.isfinite(f) else 0.0)
        else:  # uint32 / uint64
            f = float(value)
            setattr(msg, name, max(0, int(f)) if math.isfinite(f) else 0)
    return msg


class Reporter:
    """Sends ``{**static, **figures()}`` as a ``report`` action every ``interval`` seconds.

    ``static``: fields that do not change (dataset, rank, world_size, device); ``client_id``
    defaults to ``host:pid:random``. ``token``/``tls_root_certs`` as for the server's other
    calls. ``sent`` and ``errors`` count the reports that went out and those that failed.
    ``final_timeout`` bounds the last report (``close(final=True)``), which the trainer's loop
    waits for at the end of an iteration: a node that died mid-epoch without anybody noticing
    yet must not hold the loop for the whole ``timeout``.
    """

    def __init__(
        self,
        location: str,
        figures: Callable[[], Mapping[str, Any]],
        *,
        interval: float = 5.0,
        static: Mapping[str, Any] | None = None,
        client_id: str | None = None,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        timeout: float = 2.0,
        final_timeout: float = 0.5,
        start: bool = True,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval is {interval}; it must be > 0 seconds")
        self.location = location
        self.interval = float(interval)
        self.client_id = client_id or _default_client_id()
        self._figures = figures
        self._static = dict(static or {})
        # its own connection (slot 0 of its own pool), never one of the data streams
        connect = ConnectOptions(token=token, tls_root_certs=tls_root_certs, timeout=timeout)
        self._pool = ConnectionPool(location, connect)
        self._options = self._pool.options.call_options()
        last = ConnectOptions(token=token, tls_root_certs=tls_root_certs, timeout=min(timeout, final_timeout))
        self._final_options = last.call_options()
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.errors = 0
        if start:
            self.start()

    def start(self) -> None:
        """Start the reporting thread (once; a closed Reporter stays closed)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._loop, name="flightfeed-report", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.report_now()

    def report_now(self, *, final: bool = False) -> bool:
        """Send one report now; True when the server took it. Never raises. ``final``: within
        ``final_timeout``."""
        options = self._final_options if final else self._options
        with self._send_lock:
            try:
                fields = {**self._static, **dict(self._figures()), "client_id": self.client_id}
                body = report_message(fields).SerializeToString()
                for _ in self._pool.client(0).do_action(flight.Action("report", body), options):
                    pass
            except Exception as exc:  # a trainer must never die because reporting failed
                self.errors += 1
                log.debug("report to %s failed (%d so far): %s", self.location, self.errors, exc)
                self._pool.discard(0)  # reconnect on the next report
                return False
            self.sent += 1
            return True

    def close(self, *, final: bool = False) -> None:
        """Stop reporting promptly; ``final``: send one last report first (at most
        ``final_timeout`` s)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final:
            self.report_now(final=True)
        with self._send_lock:
            self._pool.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_reporter(
    location: str,
    figures: Callable[[], Mapping[str, Any]],
    *,
    interval: float | None,
    static: Mapping[str, Any],
    client_id: str,
    connect: ConnectOptions,
) -> Reporter | None:
    """A started Reporter of one iteration (None when ``interval`` is None or 0: no reports)."""
    if not interval:
        return None
    return Reporter(
        location, figures, interval=interval, static=static, client_id=client_id,
        token=connect.token, tls_root_certs=connect.tls_root_certs,
    )
