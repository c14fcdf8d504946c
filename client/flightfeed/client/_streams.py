"""Background stream readers: one thread per endpoint, whole messages into a bounded queue.

A reader counts rows against the ticket's promise. A stream that fails or ends short is retried
from the first message it has not delivered, on the endpoint's next location (another process or
data node), within the per-outage budget of :mod:`._retry`; then the consumer gets
:class:`StreamTruncated` or :class:`StreamError` naming the locations tried. Nothing is ever
silently shortened and no message is delivered twice.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.client._boundary import reached_server, retryable, translate
from flightfeed.client._members import Members
from flightfeed.client._pool import ConnectionPool
from flightfeed.client._retry import Outage, RetryPolicy
from flightfeed.client._skips import received
from flightfeed.wire.errors import FlightFeedError, StreamError, StreamTruncated
from flightfeed.wire.messages import StreamTicket, span_of

__all__ = ["StreamReader", "END"]

log = logging.getLogger("flightfeed.client")
END = object()  # queue sentinel: the stream delivered everything


class StreamReader(threading.Thread):
    """Reads one endpoint; puts ``list[pa.RecordBatch]`` (one message each), then END or an error."""

    def __init__(
        self,
        pool: ConnectionPool,
        slot: int,
        ticket: Any,
        locations: Sequence[str],
        *,
        depth: int,
        policy: RetryPolicy,
        stop: threading.Event,
        on_retry: Callable[[str, str], None] | None = None,
        members: Members | None = None,
    ) -> None:
        super().__init__(name=f"flightfeed-stream-{slot}", daemon=True)
        self.pool, self.slot, self.ticket = pool, slot, ticket
        self.locations = list(locations) or [pool.location]
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self.policy, self.stop, self.on_retry = policy, stop, on_retry
        self.members = members  # told which locations served and which failed (the next epoch's order)
        self.retried = 0  # retries over this reader's life (all outages)
        self.delivered = 0
        self._active: flight.FlightStreamReader | None = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            if self._active is not None:
                with contextlib.suppress(Exception):  # already finished
                    self._active.cancel()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        span = span_of(self.ticket)
        messages = [hi - lo for lo, hi in span.messages()]
        self.delivered = 0  # whole messages handed to the consumer: a retry resumes after them
        at = 0  # index of the location in use
        outage: Outage | None = None
        while self.delivered < len(messages) and not self.stop.is_set():
            location = self.locations[at]
            before = self.delivered
            try:
                self._read(span, messages, location)
                done = self.delivered
                if done < len(messages) and not self.stop.is_set():
                    raise StreamTruncated(
                        f"stream {self.slot} ended after {done} of {len(messages)} messages "
                        f"({sum(messages[:done])} of {sum(messages)} rows)"
                    )
            except Exception as exc:
                if self.stop.is_set():
                    return
                err = translate(exc)
                if self.delivered > before:
                    self._recovered(outage, location)
                    outage = None  # the last retry made progress: this is a new outage
                if self.members is not None and reached_server(exc):
                    self.members.heard(location)
                if not retryable(err):
                    self._fail(err, exc)
                    return
                if self.members is not None:
                    self.members.failed(location)  # the next get_flight_info tries it last
                if outage is None:
                    outage = Outage(self.policy, len(self.locations))
                pause = outage.failed(location, err)
                if pause is None:
                    self._fail(err, exc, outage)
                    return
                self.retried += 1
                self.pool.discard(self.slot, location)
                at = (at + 1) % len(self.locations)
                # one line when an outage begins (a long wait is never silent); the rest at debug level
                log.log(
                    logging.WARNING if outage.attempts == 1 else logging.DEBUG,
                    "stream %d failed at %s (%s); retry %d of this outage on %s (up to %gs: retry_timeout)",
                    self.slot, location, _first_line(err), outage.attempts, self.locations[at],
                    self.policy.timeout_s,
                )
                if self.on_retry is not None:
                    self.on_retry(location, self.locations[at])
                if pause and self.stop.wait(pause):
                    return
        if not self.stop.is_set():
            self._recovered(outage, self.locations[at])
            self._put(END)

    def _recovered(self, outage: Outage | None, location: str) -> None:
        if outage is not None:
            log.warning("stream %d continues on %s after %d retries in %.1fs", self.slot, location,
                        outage.attempts, outage.elapsed())
        if self.members is not None:
            self.members.answered(location)

    def _fail(self, err: BaseException, exc: BaseException, outage: Outage | None = None) -> None:
        """Hand the consumer the error that ends this stream (with the outage's story, if any)."""
        if outage is not None and isinstance(err, StreamError):
            text = str(err) if str(err).startswith("stream") else f"stream {self.slot}: {err}"
            err = type(err)(f"{text}; {outage.summary()}")
        elif not isinstance(err, FlightFeedError):
            err = StreamError(f"stream {self.slot}: {exc}")
        self._put(err)

    def _read(self, span: Any, messages: list[int], location: str) -> None:
        done = self.delivered
        ticket = StreamTicket()
        ticket.CopyFrom(self.ticket)
        rest = span.advanced(done)
        ticket.first_message = rest.first_message
        ticket.expected_rows = sum(messages[done:])
        client = self.pool.client(self.slot, location)
        reader = client.do_get(flight.Ticket(ticket.SerializeToString()), self.pool.options.call_options())
        with self._lock:
            self._active = reader
        told = False
        try:
            pending: list[pa.RecordBatch] = []
            have = 0
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                if chunk.data is None:  # a metadata-only message
                    continue
                if not told and self.members is not None:
                    self.members.answered(location)  # this attempt's first message arrived
                    told = True
                if self.stop.is_set():
                    return
                batch, skipped = received(chunk.data, chunk.app_metadata)
                if skipped:  # one whole client batch that lost rows (_skips): count its positions
                    if done == len(messages) or have + batch.num_rows + skipped > messages[done]:
                        raise StreamError(f"stream {self.slot}: rows with skips cross a message boundary")
                    pending.append(batch)
                    have += batch.num_rows + skipped
                    if have == messages[done]:
                        if not self._put(pending):
                            return
                        pending, have, done = [], 0, done + 1
                        self.delivered = done
                    continue
                off = 0
                while off < batch.num_rows:
                    if done == len(messages):
                        raise StreamError(f"stream {self.slot} sent more rows than its ticket promised")
                    take = min(batch.num_rows - off, messages[done] - have)
                    pending.append(batch if take == batch.num_rows else batch.slice(off, take))
                    have += take
                    off += take
                    if have == messages[done]:
                        if not self._put(pending):
                            return
                        pending, have, done = [], 0, done + 1
                        self.delivered = done
        finally:
            with self._lock:
                self._active = None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
