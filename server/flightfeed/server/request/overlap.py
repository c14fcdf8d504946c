"""A stream's next message made on a helper thread while the current one is sent.

Decoding transforms (``transforms.execute``) and shuffled gathers (``request.streaming``) both
make a message, then hand it to gRPC, which sends it; done in turn, a stream's rate is
1 / (make + send). :func:`read_ahead` overlaps the two, at the cost of up to ``depth + 1`` finished
messages per stream in memory (``depth`` queued, one in the helper's hands waiting for room).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

__all__ = ["read_ahead"]


def read_ahead(items: Iterator[pa.RecordBatch], depth: int = 1) -> Iterator[pa.RecordBatch]:
    """``items``, produced by a helper thread up to ``depth`` messages ahead of the consumer (the
    next message decodes while this one is sent). Bounded: a slow client holds back at most
    ``depth`` finished messages per stream. Closing the generator stops the helper, then closes
    ``items`` (a generator's ``finally``/``with`` blocks run then, on the closing thread)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    done = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # delivered to the consumer, in order
            put(exc)

    worker = threading.Thread(target=produce, name="flightfeed-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join(timeout=30)
        close = getattr(items, "close", None)
        if close is not None and not worker.is_alive():  # a generator: its own cleanup runs now, not at GC
            close()
