"""The serving process's life: signals, drain, a grace period with a deadline, exit.

``FlightServerBase.serve()`` is never called: a FlightServer listens from construction, and
``serve()`` would let pyarrow shut gRPC down on a signal, waiting for every stream with no
deadline (a stalled client kept a server alive for 60 s with ``--grace 2``). Instead:

1. :func:`install_signals` runs before the ready line is printed: SIGTERM/SIGINT set ``stop``;
   a second signal exits at once (code 130).
2. :func:`drain_and_exit`: the node drains (``/readyz`` unready, out of new FlightInfos); while
   clients keep requesting (a reader fetches its epoch as runs of messages, one request each:
   ``busy``) it keeps answering, until they pause for ``settle`` seconds; then the server stops
   accepting calls. All of it within ``grace`` seconds; streams still open then are cancelled by
   ending the process (their clients continue elsewhere).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.flight as flight

__all__ = ["install_signals", "drain_and_exit", "exit_with_parent"]


def install_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT: set ``stop``; a second one: exit now (130)."""
    count = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal count
        count += 1
        if count > 1:
            print("flightfeed: second signal; exiting now", file=sys.stderr, flush=True)
            os._exit(130)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def wait_for(stop: threading.Event) -> None:
    """Wait in short steps (so Python runs signal handlers promptly) until ``stop`` is set."""
    while not stop.wait(0.2):
        pass


def drain_and_exit(
    server: flight.FlightServerBase,
    grace: float,
    *,
    before: Callable[[], None],
    cleanup: Callable[[], None],
    busy: Callable[[], bool] | None = None,
    settle: float = 0.5,
) -> None:
    """Drain (``before``: mark unready, stop workers...), keep answering while ``busy()`` (streams
    in flight) until it stays false for ``settle`` seconds, stop accepting, give in-flight streams
    the rest of ``grace`` seconds. Returns when they finished in time; otherwise runs ``cleanup``
    and ends the process (code 0), which cancels the remaining streams."""
    t0 = time.monotonic()
    before()
    print(f"flightfeed: shutting down (in-flight streams get {grace:g}s to finish)", file=sys.stderr, flush=True)
    quiet: float | None = None
    while busy is not None and time.monotonic() - t0 < grace:
        now = time.monotonic()
        if busy():
            quiet = None
        elif quiet is None:
            quiet = now
        elif now - quiet >= settle:
            break
        time.sleep(0.05)
    done = threading.Thread(target=server.shutdown, name="flightfeed-shutdown", daemon=True)
    done.start()
    done.join(timeout=max(0.0, grace - (time.monotonic() - t0)))
    if not done.is_alive():
        return
    print(f"flightfeed: streams still open after {grace:g}s; cancelling them", file=sys.stderr, flush=True)
    try:
        cleanup()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the gRPC server would wait for its streams forever (also at interpreter exit)


def exit_with_parent() -> None:
    """End this process (SIGTERM to itself: a drain) when stdin closes: the parent that holds
    the other end died, even by ``kill -9`` (``--workers``' processes use this)."""

    fd = sys.stdin.fileno()

    def watch() -> None:
        try:
            while os.read(fd, 65536):  # the raw fd: no buffer lock held at interpreter exit
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="flightfeed-parent-watch", daemon=True).start()
