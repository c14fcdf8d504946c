"""Lanes: an iteration's streams pull runs of messages from a shared :class:`~._board.Board`.

One lane per FlightInfo endpoint, each with its own connection (``ConnectionPool`` slot) to the
endpoint's first location. A lane asks the board for a run of messages -- first all the messages
the plan put on its endpoint --, fetches it with one ``do_get`` (a ticket with ``first_message``,
``message_step`` and ``message_count``: tickets are pure functions of the request, so any node
serves any run), reads each message once the board's window admits it (the server waits under
gRPC's flow control meanwhile) and hands it to the board. A lane whose node is slow loses the
rest of its run to faster lanes, which steal or hedge it (see ``_board``), so the work divides
itself by each node's speed. While a run's last message arrives, the lane requests its next run.

Failures: a lane whose request fails returns its undelivered messages to the board at once
(other lanes may take them) and retries on its endpoint's next location within the per-outage
budget of :mod:`._retry`; a lane that gives up leaves the work to the others, and the iteration
fails only when every lane gave up (with the last lane's story) or on an error that no retry can
fix (bad request, stale data, auth). Row counts are checked per message: a request that ends
short raises :class:`StreamTruncated` inside the lane (and is retried); nothing is delivered twice.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.client._connect.boundary import first_line, reached_server, retryable, translate
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._connect.retry import Outage, RetryPolicy
from flightfeed.client._receive.board import Board, Run
from flightfeed.client._receive.skips import received
from flightfeed.client._receive.views import plain_batch
from flightfeed.wire.errors import FlightFeedError, StreamError, StreamTruncated
from flightfeed.wire.messages import StreamTicket, span_of
from flightfeed.wire.plan import stream_messages

__all__ = ["LaneSettings", "Lane", "Lanes", "WINDOW_MESSAGE_BYTES", "join_lanes"]

log = logging.getLogger("flightfeed.client")

#: the window's byte budget counts ``streams x (prefetch + 1)`` messages of this size (the server's
#: default message size): the memory a reader held before work moved between streams
WINDOW_MESSAGE_BYTES = 16 << 20


@dataclass(frozen=True)
class LaneSettings:
    """How lanes share work. ``window_bytes``: received-but-not-consumed bytes at most (None:
    ``streams x (prefetch + 1) x 16 MiB``; never fewer than ``streams x (prefetch + 1)``
    messages); ``run_seconds``: a run lasts about this long at the lane's speed; ``hedge``:
    request a lagging message again elsewhere (first copy wins); ``move``: False keeps every
    message on the stream the plan put it on (one request per message; a baseline for benchmarks)."""

    window_bytes: int | None = None
    run_seconds: float = 0.25
    hedge: bool = True
    move: bool = True


class Lanes:
    """The lanes of one iteration over the (not started) endpoint readers' tickets and locations."""

    def __init__(
        self,
        readers: Sequence[Any],
        *,
        prefetch: int,
        settings: LaneSettings | None = None,
        count: Callable[[str, int], None] | None = None,
        stage: Callable[[list[pa.RecordBatch]], Any] | None = None,
        discard: Callable[[Any], None] | None = None,
    ) -> None:
        settings = settings or LaneSettings()
        #: a whole message -> its payload, on the receiving lane's thread (the device path stages it
        #: into the pinned ring: ``_ring``); None: the payload is the message's RecordBatches
        self.stage = stage
        self.readers = list(readers)
        spans = [span_of(r.ticket) for r in self.readers]
        order = list(stream_messages(spans))
        start, message_rows = (spans[0].start_row, spans[0].message_rows) if spans else (0, 1)
        grid = [(lo - start) // message_rows for _, (lo, _hi) in order]
        step = grid[1] - grid[0] if len(grid) > 1 else 1
        if any(b - a != step for a, b in itertools.pairwise(grid)) or step < 1:
            raise StreamError(f"the endpoints' messages are not an evenly spaced sequence: {grid[:8]}...")
        k = max(1, len(self.readers))
        depth = k * (max(1, prefetch) + 1)
        budget = settings.window_bytes if settings.window_bytes is not None else depth * WINDOW_MESSAGE_BYTES
        self.board = Board(
            rows=[hi - lo for _, (lo, hi) in order],
            plan=[stream for stream, _ in order],
            homes=[r.locations[0] for r in self.readers] or [""],
            window=depth,
            run_seconds=settings.run_seconds,
            hedging=settings.hedge,
            moving=settings.move,
            window_bytes=max(0, budget),
            count=count or (lambda event, n: None),
            discard=discard or (lambda payload: None),
        )
        self.lanes = [Lane(self, slot, r, grid, step) for slot, r in enumerate(self.readers)]
        #: data nodes (locations) the lanes start on: what the client reports (the server's scaling rule)
        self.nodes = len({r.locations[0] for r in self.readers})

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()

    def messages(self) -> Any:
        """The messages (``list[pa.RecordBatch]`` each) in canonical order."""
        return self.board.messages(alive=lambda: any(lane.is_alive() for lane in self.lanes))


class Lane(threading.Thread):
    """Fetches runs for one endpoint slot (``cancel`` and ``join`` like the old stream reader)."""

    def __init__(self, lanes: Lanes, slot: int, reader: Any, grid: list[int], step: int) -> None:
        super().__init__(name=f"flightfeed-stream-{slot}", daemon=True)
        self.board = lanes.board
        self.stage = lanes.stage
        self.slot, self.grid, self.step = slot, grid, step
        self.template = reader.ticket
        self.pool: ConnectionPool = reader.pool
        self.locations: list[str] = list(reader.locations)
        self.policy: RetryPolicy = reader.policy
        self.stop: threading.Event = reader.stop
        self.on_retry: Callable[[str, str], None] | None = reader.on_retry
        self.members: Members | None = reader.members
        self.delivered = 0  # messages this lane delivered (a retry that adds some ends the outage)
        self._active: flight.FlightStreamReader | None = None
        self._help_next = False  # the last run was given up to help: leftovers and help come first
        self._lock = threading.Lock()
        #: inside ``do_get``, before the stream's first message: a frozen node (SIGSTOP, a hung
        #: process) never sends it, and pyarrow offers no way to cancel that wait (see ``join_lanes``)
        self.calling = False

    def cancel(self) -> None:
        with self._lock:
            if self._active is not None:
                with contextlib.suppress(Exception):  # already finished
                    self._active.cancel()

    def run(self) -> None:
        at = 0
        outage: Outage | None = None
        while not self.stop.is_set():
            location = self.locations[at]
            run = self.board.next_run(self.slot, location, self.stop, others_first=self._help_next)
            self._help_next = False
            if run is None:
                return
            before = self.delivered
            try:
                self._fetch(run, location)
                if self.delivered > before:
                    self._recovered(outage, location)
                    outage = None
            except Exception as exc:
                self.board.release(run)
                if self.stop.is_set():
                    return
                err = translate(exc)
                if self.delivered > before:
                    self._recovered(outage, location)
                    outage = None  # the last try made progress: this is a new outage
                if self.members is not None and reached_server(exc):
                    self.members.heard(location)
                if not retryable(err):
                    self.board.fail(_final(err, exc, self.slot))
                    return
                if self.members is not None:
                    self.members.failed(location)  # the next get_flight_info tries it last
                outage = outage or Outage(self.policy, len(self.locations))
                pause = outage.failed(location, err)
                if pause is None:
                    self.board.lane_gone(self.slot, _final(err, exc, self.slot, outage))
                    return
                self.pool.discard(self.slot, location)
                at = (at + 1) % len(self.locations)
                self.board.moved_to(self.slot, self.locations[at])
                # one line when an outage begins (a long wait is never silent); the rest at debug level
                log.log(
                    logging.WARNING if outage.attempts == 1 else logging.DEBUG,
                    "stream %d failed at %s (%s); retry %d of this outage on %s (up to %gs: retry_timeout)",
                    self.slot, location, first_line(err), outage.attempts, self.locations[at],
                    self.policy.timeout_s,
                )  # fmt: skip
                if self.on_retry is not None:
                    self.on_retry(location, self.locations[at])
                if pause and self.stop.wait(pause):
                    return

    def _recovered(self, outage: Outage | None, location: str) -> None:
        if outage is not None:
            log.warning("stream %d continues on %s after %d retries in %.1fs", self.slot, location,
                        outage.attempts, outage.elapsed())

    def _ticket(self, run: Run) -> Any:
        ticket = StreamTicket()
        ticket.CopyFrom(self.template)
        ticket.first_message = self.grid[run.indices[0]]
        stride = run.indices[1] - run.indices[0] if len(run.indices) > 1 else 1
        ticket.message_step = self.step * stride
        ticket.message_count = len(run.indices)
        ticket.expected_rows = sum(self.board.rows[j] for j in run.indices)
        ticket.stream_index = self.slot
        return ticket

    def _fetch(self, run: Run, location: str) -> None:
        """Receive ``run``'s messages; returns when it is done, cut short or lost a race."""
        ticket = self._ticket(run)
        client = self.pool.client(self.slot, location)
        self.calling = True  # do_get waits for the stream's first message: nothing can cancel that wait
        try:
            reader = client.do_get(flight.Ticket(ticket.SerializeToString()), self.pool.options.call_options())
        finally:
            self.calling = False
        with self._lock:
            self._active = reader
        rows = self.board.rows
        told = False
        try:
            pending: list[pa.RecordBatch] = []
            have = 0
            while True:
                if not have and not self.board.admit(run, self.stop):  # the window, or help elsewhere
                    self._help_next = not self.stop.is_set()
                    self._drop(reader, run)
                    return
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    break
                if chunk.data is None:  # a metadata-only message
                    continue
                if not told and self.members is not None:
                    self.members.answered(location)  # this request's first message arrived
                    told = True
                if self.stop.is_set():
                    return
                batch, skipped = received(plain_batch(chunk.data), chunk.app_metadata)  # views: plain
                off = 0
                while off < batch.num_rows or (skipped and off == 0):
                    if run.pos >= len(run.indices):
                        raise StreamError(f"stream {self.slot} sent more rows than its ticket promised")
                    need = rows[run.current] - have
                    if skipped:  # one whole client batch that lost rows (_skips): count its positions
                        if batch.num_rows + skipped > need:
                            raise StreamError(f"stream {self.slot}: rows with skips cross a message boundary")
                        part, positions = batch, batch.num_rows + skipped
                        off = max(1, batch.num_rows)
                    else:
                        take = min(batch.num_rows - off, need)
                        part = batch if take == batch.num_rows else batch.slice(off, take)
                        positions, off = take, off + take
                    if not self.board.progress(run, positions):
                        self._drop(reader, run)  # another copy of this message won
                        return
                    pending.append(part)
                    have += positions
                    if have < rows[run.current]:
                        continue
                    nbytes = sum(p.nbytes for p in pending)
                    payload: Any = pending
                    if self.stage is not None:
                        try:
                            payload = self.stage(pending)
                        except Exception as exc:  # no retry fixes a column that cannot be staged
                            self.board.fail(exc)
                            self._drop(reader, run)
                            return
                    # a payload that holds other memory than the received parts says how much (``_packed``)
                    more = self.board.deliver(run, payload, getattr(payload, "held_bytes", nbytes))
                    self.delivered += 1
                    pending, have = [], 0
                    if not more:
                        if run.pos < len(run.indices):  # cut short by a steal
                            self._drop(reader, run)
                        else:
                            _finish(reader)
                        return
            if run.pos < len(run.indices):
                count = len(run.indices)
                raise StreamTruncated(
                    f"stream {self.slot} ended after {run.pos} of {count} messages "
                    f"({sum(rows[j] for j in run.indices[: run.pos]) + have} of "
                    f"{sum(rows[j] for j in run.indices)} rows)"
                )
        finally:
            with self._lock:
                self._active = None

    def _drop(self, reader: flight.FlightStreamReader, run: Run) -> None:
        with contextlib.suppress(Exception):
            reader.cancel()
        self.board.release(run)


def join_lanes(lanes: Sequence[threading.Thread], timeout: float = 5.0, grace: float = 0.5) -> list[threading.Thread]:
    """Join cancelled lanes (their ``stop`` set); returns those left running. A lane still waiting
    in ``do_get`` for a node's first message cannot be cancelled: a live node answers within
    milliseconds, so such lanes get ``grace`` seconds in all; one on a frozen node (not dead, it
    just never answers) is then not waited for: the loop ends when the consumer has its last batch,
    not when the frozen node's call times out. That thread ends as soon as its call returns (the
    node resumes or its connection drops): it sees ``stop`` and touches nothing else."""
    left = []
    calling_until = time.monotonic() + grace
    for lane in lanes:
        until = time.monotonic() + timeout
        while lane.is_alive():
            now = time.monotonic()
            if now >= until or (getattr(lane, "calling", False) and now >= calling_until):
                break
            lane.join(0.02)
        if lane.is_alive():
            left.append(lane)
    if left:
        log.debug("%d stream thread(s) left waiting for a node that does not answer", len(left))
    return left


def _finish(reader: flight.FlightStreamReader) -> None:
    """The run is complete: the stream should end here; a server that sends more (one that does
    not know ``message_count``) is cancelled."""
    try:
        extra = reader.read_chunk()
    except StopIteration:
        return
    except Exception:
        return
    if extra is not None:
        with contextlib.suppress(Exception):
            reader.cancel()


def _final(err: BaseException, exc: BaseException, slot: int, outage: Outage | None = None) -> BaseException:
    """The error that ends lane ``slot`` (with the outage's story, if any)."""
    if outage is not None and isinstance(err, StreamError):
        text = str(err) if str(err).startswith("stream") else f"stream {slot}: {err}"
        return type(err)(f"{text}; {outage.summary()}")
    if not isinstance(err, FlightFeedError):
        return StreamError(f"stream {slot}: {exc}")
    return err
