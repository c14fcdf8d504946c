"""The blocks of one remote object, as readers ask for them: staged by the read-ahead, kept in the
block cache, or fetched now (``docs/remote-reads.md``).

``prefetch(spans)`` sends the GETs of the blocks a coming window needs (those neither staged nor
cached), neighbours coalesced, and stages each block's future (at most ``staged_bytes``; the oldest
are dropped past that); a block's bytes go to the block cache when they arrive. ``read_spans``
takes each block from the stage, else the block cache, else fetches the rest in one coalesced
batch; what it hands out is counted as served (``observe/range_metrics``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence, Set
from concurrent.futures import Future

import pyarrow as pa

from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.source import RangeSource, Span

__all__ = ["StagedRanges", "with_gaps"]


def with_gaps(
    spans: Sequence[Span], chosen: Sequence[int], gap_bytes: int, served: Set[Span] = frozenset()
) -> list[int]:
    """``chosen`` block indices (of ``spans``, in file order), plus the blocks between two of them
    whose bytes together are at most ``gap_bytes`` and that were not ``served`` in this pass over
    the file: one GET then carries the run, and those blocks are staged and kept for a later window
    (a block already served is not needed again this epoch: fetching it would read it twice)."""
    picked = sorted(set(chosen))
    out: list[int] = []
    for a, b in itertools.pairwise(picked):
        out.append(a)
        if b - a > 1 and spans[b][0] - spans[a][1] <= gap_bytes:
            out.extend(c for c in range(a + 1, b) if spans[c] not in served)
    if picked:
        out.append(picked[-1])
    return out


class StagedRanges:
    """Blocks of ``source`` by byte range (see the module docstring)."""

    def __init__(self, source: RangeSource, blocks: BlockStore, version: str, staged_bytes: int = 256 << 20) -> None:
        self.source = source
        self.blocks = blocks
        self.version = version
        self._staged_max = staged_bytes
        self._lock = threading.Lock()
        self._staged: OrderedDict[Span, Future[pa.Buffer]] = OrderedDict()
        self._staged_total = 0
        self._closed = False
        self._served: set[Span] = set()  # blocks handed to readers in this pass over the file

    def served(self, blocks: int) -> Set[Span]:
        """The blocks served in this pass over the file (of ``blocks`` blocks): a new pass starts
        once every block was served (an epoch reads each block once)."""
        with self._lock:
            if len(self._served) >= blocks:
                self._served.clear()
            return frozenset(self._served)

    def key(self, span: Span) -> str:
        return f"{self.source.uri}#{span[0]}-{span[1]}"

    def _take(self, span: Span) -> Future[pa.Buffer] | None:
        with self._lock:
            future = self._staged.pop(span, None)
            if future is not None:
                self._staged_total -= span[1] - span[0]
            return future

    def read_spans(self, spans: Sequence[Span]) -> list[pa.Buffer]:
        """The bytes of each span, in the order given (see the module docstring)."""
        out: list[pa.Buffer | None] = [None] * len(spans)
        missing: list[int] = []
        for i, span in enumerate(spans):
            staged = self._take(span)
            if staged is not None:
                out[i] = staged.result()
            elif self.blocks.has(self.key(span)):
                out[i] = self._one(span)
            else:
                missing.append(i)
        if len(missing) == 1:
            out[missing[0]] = self._one(spans[missing[0]])
        elif missing:
            got: dict[Span, Future[pa.Buffer]] = {}
            self.source.read_many([spans[i] for i in missing], lambda s, f: got.__setitem__(s, f))
            for i in missing:
                data = got[spans[i]].result()
                self._keep(spans[i], data)
                out[i] = data
        result = [b for b in out if b is not None]
        with self._lock:
            self._served.update(spans)
        self.source.metrics.served(self.source.dataset, sum(b.size for b in result))
        return result

    def _one(self, span: Span) -> pa.Buffer:
        """One block: from the block cache, else one GET (then kept)."""
        return self.blocks.get(self.key(span), span[1] - span[0], self.version, lambda: self.source.read(*span))

    def prefetch(self, spans: Sequence[Span]) -> None:
        """Send the GETs of the blocks of ``spans`` not staged nor cached (see the module docstring)."""
        with self._lock:
            wanted = [s for s in sorted(set(spans)) if s not in self._staged]
        wanted = [s for s in wanted if not self.blocks.has(self.key(s))]
        if wanted:
            self.source.read_many(wanted, self._stage)

    def stage_bytes(self, span: Span, data: pa.Buffer) -> None:
        """Stage the bytes of block ``span`` already fetched (e.g. within the index's GET)."""
        done: Future[pa.Buffer] = Future()
        done.set_result(data)
        self._stage(span, done)

    def _stage(self, span: Span, future: Future[pa.Buffer]) -> None:
        with self._lock:
            self._staged[span] = future
            self._staged_total += span[1] - span[0]
            while self._staged_total > self._staged_max and len(self._staged) > 1:
                old, _ = self._staged.popitem(last=False)
                self._staged_total -= old[1] - old[0]
        future.add_done_callback(lambda f: self._kept(span, f))

    def _kept(self, span: Span, future: Future[pa.Buffer]) -> None:
        if future.exception() is None and not self._closed:  # (a closed reader keeps nothing more)
            self._keep(span, future.result())

    def _keep(self, span: Span, data: pa.Buffer) -> None:
        # the bytes are in hand (staged or served); the cache only serves later reads
        with contextlib.suppress(Exception):
            self.blocks.keep(self.key(span), data, self.version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._staged.clear()
            self._staged_total = 0
        self.source.close()
