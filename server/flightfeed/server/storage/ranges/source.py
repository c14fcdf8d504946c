"""Byte ranges of one remote object: sized ranged GETs through ``pyarrow.fs`` (``read_at``), with
retries, neighbouring ranges coalesced, bytes in flight bounded, and the manifest's block
checksums verified before any byte is handed out (``docs/remote-reads.md``).

Coalescing: the ranges asked for together (the blocks a shuffle window needs, sorted by offset)
are merged into one GET while the gap between them is at most ``gap_bytes`` and the merged GET
stays under ``max_request_bytes``; each block is then a zero-copy slice of its GET's buffer.
GETs run on a process-wide pool, at most ``max_in_flight_bytes`` of them at once per call.

Checksums: with block checksums (``readers/blocks.py``: xxh3 of every fixed-size block of the
file) a range is widened to whole checksum blocks before it is fetched, and every checksum block
fetched is hashed and compared; a mismatch is a :class:`ShardError` naming the shard and the
block, and its bytes are never served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from flightfeed.server.observe.range_metrics import RangeMetrics
from flightfeed.server.readers.blocks import BlockSums, hash_block
from flightfeed.server.storage.s3_client import translate, with_retries
from flightfeed.wire.errors import ShardError, StorageError

__all__ = ["RangeSource", "RangeSettings", "Span"]

#: (lo, hi): bytes [lo, hi) of the object
Span = tuple[int, int]

_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="flightfeed-range-get")


@dataclass(frozen=True)
class RangeSettings:
    """How ranges are fetched (``--s3-range-*``; defaults fit S3: a GET costs ~20-50 ms before its
    first byte, then ~50-100 MB/s per connection)."""

    gap_bytes: int = 1 << 20  # merge two ranges whose gap is at most this (the gap is read and dropped)
    #: a window's blocks fetch the blocks between them too when those are at most this many bytes,
    #: and keep them for a later window (``staged.with_gaps``): fewer, larger GETs, each block still
    #: fetched about once per epoch (docs/remote-reads.md, "The first batch")
    kept_gap_bytes: int = 4 << 20
    max_request_bytes: int = 32 << 20  # one GET carries at most this much (unless one block is larger)
    max_in_flight_bytes: int = 128 << 20  # bytes of GETs in flight at once per call
    retries: int = 4


class RangeSource:
    """Ranged reads of the object ``path`` (``size`` bytes) for dataset ``dataset``."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        path: str,
        size: int,
        *,
        uri: str,
        dataset: str,
        metrics: RangeMetrics,
        settings: RangeSettings = RangeSettings(),
        sums: BlockSums | None = None,
    ) -> None:
        self.uri = uri
        self.size = size
        self.dataset = dataset
        self.metrics = metrics
        self.settings = settings
        self._fs = fs
        self._path = path
        self._sums = sums if sums is not None and sums.covers(size) else None
        if sums is not None and self._sums is None:
            raise ShardError(
                f"shard {uri} has {size} bytes, but its manifest lists {len(sums.hashes)} checksum block(s) "
                f"of {sums.size} bytes; restore the shard or re-write the manifest"
            )
        self._file: pa.NativeFile | None = None
        self._lock = threading.Lock()
        self._corrupt: list[Callable[[str], None]] = []

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block fails its checksum (the dataset is marked corrupt)."""
        self._corrupt.append(listener)

    @property
    def checksum_bytes(self) -> int | None:
        """The size of the manifest's checksum blocks, None without checksums."""
        return None if self._sums is None else self._sums.size

    # -- one GET -----------------------------------------------------------------------------
    def _input(self) -> pa.NativeFile:
        with self._lock:
            if self._file is None:
                self._file = self._fs.open_input_file(self._path)  # (one HEAD request per source)
            return self._file

    def _get(self, span: Span, blocks: int, *, verify: bool = True) -> pa.Buffer:
        lo, hi = span
        if lo < 0 or hi > self.size or lo >= hi:
            raise ShardError(f"shard {self.uri}: bytes [{lo}, {hi}) lie outside the object ({self.size} bytes)")

        def once() -> pa.Buffer:
            try:
                data = self._input().read_at(hi - lo, lo)  # type: ignore[call-arg]  # (stubs lack the arguments)
            except FileNotFoundError as exc:
                raise translate(exc, self.uri) or StorageError(f"{self.uri}: object vanished while read") from None
            buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
            if buf.size != hi - lo:
                raise OSError(f"short read at offset {lo}: {buf.size} of {hi - lo} bytes")
            return buf

        t0 = time.perf_counter()
        buf = with_retries(once, self.uri, retries=self.settings.retries)
        self.metrics.request(self.dataset, buf.size, blocks, time.perf_counter() - t0)
        if verify:
            self._verify(lo, buf)
        return buf

    def _widen(self, span: Span) -> Span:
        """``span`` widened to whole checksum blocks (unchanged without checksums)."""
        if self._sums is None:
            return span
        size = self._sums.size
        return (span[0] // size) * size, min(self.size, -(-span[1] // size) * size)

    def _verify(self, lo: int, buf: pa.Buffer) -> None:
        if self._sums is None:
            return
        size = self._sums.size
        for b in range(lo // size, -(-(lo + buf.size) // size)):
            b_lo, b_hi = b * size, min(self.size, (b + 1) * size)
            got = hash_block(buf.slice(b_lo - lo, b_hi - b_lo))
            if got != self._sums.hashes[b]:
                reason = (
                    f"shard {self.uri}: block {b} (bytes {b_lo}-{b_hi}) does not match its manifest checksum "
                    f"({self._sums.algo} {got}, manifest {self._sums.hashes[b]}); none of its rows are served"
                )
                for listener in list(self._corrupt):
                    listener(reason)
                raise ShardError(reason)

    # -- reads ---------------------------------------------------------------------------------
    def read(self, lo: int, hi: int, *, verify: bool = True) -> pa.Buffer:
        """Bytes ``[lo, hi)`` in one GET (widened to checksum blocks, then sliced). ``verify=False``
        for metadata (footers, headers, pages of HDF5 metadata): it is not served as rows, and what
        it points to is checked where it is (row counts, the blocks' own checksums)."""
        w_lo, w_hi = self._widen((lo, hi)) if verify else (lo, hi)
        return self._get((w_lo, w_hi), 1, verify=verify).slice(lo - w_lo, hi - lo)

    def plan(self, spans: Sequence[Span], gap_bytes: int | None = None) -> list[tuple[Span, list[Span]]]:
        """The GETs that fetch ``spans``: (the GET's range, the spans it carries), in offset order."""
        settings = self.settings
        gap = settings.gap_bytes if gap_bytes is None else gap_bytes
        gets: list[tuple[Span, list[Span]]] = []
        for span in sorted(set(spans)):
            w_lo, w_hi = self._widen(span)
            if gets:
                (g_lo, g_hi), carried = gets[-1]
                if w_lo - g_hi <= gap and max(g_hi, w_hi) - g_lo <= settings.max_request_bytes:
                    gets[-1] = ((g_lo, max(g_hi, w_hi)), [*carried, span])
                    continue
            gets.append(((w_lo, w_hi), [span]))
        return gets

    def read_many(
        self, spans: Sequence[Span], deliver: Callable[[Span, Future[pa.Buffer]], None], *, gap_bytes: int | None = None
    ) -> None:
        """Fetch ``spans`` coalesced (see the module docstring); ``deliver(span, future)`` is called
        for each span before its GET is sent (the future gives its bytes, or the GET's error).
        Returns once every GET is sent, at most ``max_in_flight_bytes`` of them outstanding.
        ``gap_bytes`` overrides the settings' largest gap read and dropped."""
        in_flight: list[tuple[int, Future[pa.Buffer]]] = []
        budget = self.settings.max_in_flight_bytes
        for (g_lo, g_hi), carried in self.plan(spans, gap_bytes):
            in_flight = [(n, f) for n, f in in_flight if not f.done()]
            while in_flight and sum(n for n, _ in in_flight) + (g_hi - g_lo) > budget:
                wait([f for _, f in in_flight], return_when=FIRST_COMPLETED)
                in_flight = [(n, f) for n, f in in_flight if not f.done()]
            whole = _POOL.submit(self._get, (g_lo, g_hi), len(carried))
            in_flight.append((g_hi - g_lo, whole))
            for span in carried:
                deliver(span, _slice(whole, span[0] - g_lo, span[1] - span[0], copy=len(carried) > 1))

    def close(self) -> None:
        with self._lock:
            file, self._file = self._file, None
        if file is not None:
            file.close()


def _slice(whole: Future[pa.Buffer], offset: int, length: int, *, copy: bool) -> Future[pa.Buffer]:
    """The future of bytes ``[offset, offset + length)`` of ``whole``'s; with ``copy``, in a buffer
    of their own (so a record batch decoded from one block of a coalesced GET does not keep the
    whole GET's buffer alive in the chunk cache: a memcpy, about 0.1 ms per MB)."""
    part: Future[pa.Buffer] = Future()

    def done(f: Future[pa.Buffer]) -> None:
        exc = f.exception()
        if exc is not None:
            part.set_exception(exc)
        else:
            piece = f.result().slice(offset, length)
            part.set_result(pa.py_buffer(piece.to_pybytes()) if copy else piece)

    whole.add_done_callback(done)
    return part
