"""Run the sidecar app with uvicorn on a background thread: :func:`start_sidecar`.

The listening socket is bound before the thread starts, so port 0 gives a real port at once
and a busy port fails in the caller, not in the thread.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.sidecar.app import create_app
from flightfeed.server.sidecar.sources import StatsSource
from flightfeed.wire.errors import ConfigError

__all__ = ["SidecarHandle", "start_sidecar"]

log = logging.getLogger("flightfeed.sidecar")


class SidecarHandle:
    """A running sidecar: ``url`` (``http://host:port``), ``port`` (the real one) and ``stop()``."""

    def __init__(
        self, server: uvicorn.Server, thread: threading.Thread, sock: socket.socket, host: str
    ) -> None:
        self._server = server
        self._thread = thread
        self._sock = sock
        self.host = host
        self.port: int = int(sock.getsockname()[1])
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else ("[::1]" if host == "::" else host)
        shown = f"[{shown}]" if ":" in shown and not shown.startswith("[") else shown
        self.url = f"http://{shown}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving (open connections get ``timeout`` seconds) and join the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> SidecarHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise ConfigError(
            f"the sidecar cannot listen on {host}:{port} ({exc.strerror or exc}); pick another "
            "--sidecar-port/--port or stop the process using it"
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def start_sidecar(
    source: StatsSource, host: str = "127.0.0.1", port: int = 8816, *, log_level: str = "warning",
    start_timeout: float = 10.0, token: str | None = None, tenants: TenantRegistry | None = None,
) -> SidecarHandle:
    """Serve ``create_app(source, token, tenants)`` on ``host:port`` (0: any free port) from a daemon thread."""
    app = create_app(source, token, tenants)
    sock = _bind(host, port)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        ws="none",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="flightfeed-sidecar", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise ConfigError(f"the sidecar did not start on {host}:{port}; see the log above")
        time.sleep(0.01)
    handle = SidecarHandle(server, thread, sock, host)
    log.info("sidecar serving on %s", handle.url)
    return handle
