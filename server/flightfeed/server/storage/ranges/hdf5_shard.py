"""A remote HDF5 file read by chunk (``docs/remote-reads.md``): h5py reads the metadata (groups,
dataset headers, the chunk index) through a file-like object over ranged GETs with a small page
cache (16 MiB per file; with a manifest's checksums the pages are its checksum blocks, verified),
and the stored deflate chunks come by range from the file's chunk map (``hdf5/chunk_map``)
through the block cache, inflated outside h5py (``hdf5/chunks``).

A file whose columns are not all read by the chunk map (filters other than deflate and shuffle,
compound or string datasets) is read whole as before (:class:`NeedsWholeShard`): h5py reading
its chunks through the page cache would cost one small GET per metadata page and chunk.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import pyarrow as pa

from flightfeed.server.readers.hdf5.chunk_map import ChunkMap, ChunkSource, map_from_bytes, map_to_bytes
from flightfeed.server.readers.hdf5.reader import Hdf5Shard
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.ranges.arrow_shard import NeedsWholeShard
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.file_object import SeekableFile
from flightfeed.server.storage.ranges.source import RangeSource, Span
from flightfeed.server.storage.ranges.staged import StagedRanges
from flightfeed.wire.errors import ShardError

__all__ = ["RangedHdf5Shard", "open_ranged_hdf5", "PagedFile"]

PAGE_BYTES = 256 << 10  # h5py's metadata reads are a few KB; one GET brings their neighbours too
PAGES_KEPT_BYTES = 16 << 20  # metadata pages kept per file (at least two pages)


class _Pages:
    """The metadata pages of one remote file (shared by its file objects), least recent dropped."""

    def __init__(self, source: RangeSource) -> None:
        self.source = source
        # with a manifest's checksums, pages are its checksum blocks, each verified (h5py may
        # read a partial last chunk, or a dataset's fill, through them)
        self.verify = source.checksum_bytes is not None
        self.page_bytes = source.checksum_bytes or PAGE_BYTES
        self._lock = threading.Lock()
        self._pages: OrderedDict[int, bytes] = OrderedDict()

    def page(self, k: int) -> bytes:
        with self._lock:
            data = self._pages.get(k)
            if data is not None:
                self._pages.move_to_end(k)
                return data
        lo = k * self.page_bytes
        data = self.source.read(lo, min(self.source.size, lo + self.page_bytes), verify=self.verify).to_pybytes()
        with self._lock:
            self._pages[k] = data
            while len(self._pages) > max(2, PAGES_KEPT_BYTES // self.page_bytes):
                self._pages.popitem(last=False)
        return data


class PagedFile(SeekableFile):
    """A read-only, seekable file object over a remote file's pages (what h5py reads through)."""

    def __init__(self, pages: _Pages) -> None:
        super().__init__(pages.source.size)
        self._pages = pages

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self._size - self._pos))
        done = 0
        while done < want:
            k, at = divmod(self._pos + done, self._pages.page_bytes)
            page = self._pages.page(k)
            n = min(want - done, len(page) - at)
            view[done : done + n] = page[at : at + n]
            done += n
        self._pos += done
        return done


class _RangeChunks:
    """``readers.hdf5.chunk_map.ChunkSource`` over the block cache and ranged GETs."""

    def __init__(self, ranges: StagedRanges) -> None:
        self._ranges = ranges
        self.identity: tuple[Any, ...] = (ranges.source.uri, ranges.version)

    def read_spans(self, spans: Sequence[Span]) -> list[Any]:
        return [memoryview(b) for b in self._ranges.read_spans(spans)]

    def keep_map(self, name: str, build: Callable[[], ChunkMap]) -> ChunkMap:
        """The chunk map of dataset ``name``, kept in the block cache beside the file's chunks (a
        restarted server does not walk the chunk index through ranged GETs again)."""
        r = self._ranges
        key = f"{r.source.uri}#chunkmap:{name}"
        made: list[ChunkMap] = []

        def fetch() -> pa.Buffer:
            made.append(build())
            return pa.py_buffer(map_to_bytes(made[0]))

        data = r.blocks.get(key, None, r.version, fetch)
        if made:
            return made[0]
        try:
            return map_from_bytes(data.to_pybytes())
        except ValueError:
            raise ShardError(f"{key}: the cached chunk map is damaged; delete the cache directory") from None


class _Remote:
    """``readers.hdf5.reader.RemoteFile`` over one object: pages for h5py, chunks by range."""

    def __init__(self, source: RangeSource, ranges: StagedRanges) -> None:
        self.nbytes = source.size
        self._pages = _Pages(source)
        self.chunks: ChunkSource = _RangeChunks(ranges)

    def open(self) -> BinaryIO:
        return PagedFile(self._pages)  # type: ignore[return-value]  # (a RawIOBase: what h5py reads)


class RangedHdf5Shard(Hdf5Shard):
    """An :class:`Hdf5Shard` over a remote file, read by chunk (see the module docstring)."""

    #: read by range from object storage (``data/shuffle_sizing`` keeps its windows short)
    ranged = True
    #: this shard's position in its dataset
    index = 0
    _staged: StagedRanges

    @property
    def block_cache(self) -> ShardCache | None:
        """The node's cache this shard keeps its chunks in (None: ``--cache-size 0``); /readyz
        watches its problems (a full disk)."""
        return self._staged.blocks.cache

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block fails its manifest checksum (``Dataset.mark_corrupt``)."""
        self._staged.source.on_corrupt(listener)

    def fetch_ahead(self, chunks: list[int]) -> None:
        """The read-ahead's hook: send the GETs of the stored chunks of served ``chunks`` now,
        neighbours coalesced (``storage/ranges/staged``)."""
        spans = [span for c in chunks if 0 <= c < len(self._offsets) - 1 for span in self.chunk_spans(c)]
        self._staged.prefetch(spans)

    def close(self) -> None:
        super().close()
        self._staged.close()


def open_ranged_hdf5(
    source: RangeSource, blocks: BlockStore, *, version: str, index: int = 0, options: Mapping[str, Any]
) -> RangedHdf5Shard:
    """The remote HDF5 file of ``source`` by chunk; :class:`NeedsWholeShard` when some column needs
    HDF5's own reading (see the module docstring)."""
    staged = StagedRanges(source, blocks, version)
    unknown = sorted(set(options) - {"group", "casts", "datasets"})
    if unknown:
        raise ShardError(f"HDF5 reader: unknown option(s) {', '.join(unknown)} (known: group, casts, datasets)")
    shard = RangedHdf5Shard(source.uri, source.uri, remote=_Remote(source, staged), **options)
    shard._staged = staged
    shard.index = index
    if not shard.all_mapped:
        shard.close()
        raise NeedsWholeShard(f"{source.uri}: some datasets are not deflate chunks of whole rows")
    return shard
