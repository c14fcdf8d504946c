"""Run a plan on one message: the decode pool fills the message's output buffer in place.

Per message, the transformed column's output is one Arrow buffer (``rows x row_bytes``); the
pool's threads write each row straight into its slot (Pillow decodes and resamples without the
GIL). Per stream, one message is made while the previous one is sent (:func:`read_ahead`, depth
1) and gRPC's flow control holds back the rest, so a slow client pins at most the message being
sent, one finished message and the one being made.

A row whose bytes do not decode (or whose step fails) raises :class:`ShardError` naming the
dataset, the stored row and the shard file, unless the plan says ``skip``: then the row is
dropped, counted (``flightfeed_rows_skipped_total``) and announced to the client: the message is
sent as one RecordBatch per client batch, and each batch that lost rows carries a ``SkipInfo``
(positions, skipped) that the service sends as the RecordBatch's Flight app_metadata.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.request.gather import gather
from flightfeed.server.request.overlap import read_ahead
from flightfeed.server.transforms import native
from flightfeed.server.transforms.defaults import default_registry
from flightfeed.server.transforms.deferred import crop_name, flip_name, frame_params, params_arrays
from flightfeed.server.transforms.frame import Frame
from flightfeed.server.transforms.pipeline import ColumnPlan, Plan, Step, compile_plan, resolve_command
from flightfeed.server.transforms.registry import Registry
from flightfeed.server.transforms.rng import DrawKey, row_generator
from flightfeed.wire.errors import ShardError
from flightfeed.wire.messages import INDEX_COLUMN, SkipInfo
from flightfeed.wire.transforms import SKIP_INFO_KEY

__all__ = ["Transformer", "SKIP_KEY", "run_row", "fill_row", "prepare_row", "read_ahead"]

SKIP_KEY = SKIP_INFO_KEY  # schema-metadata key the service turns into app_metadata
_I64 = npt.NDArray[np.int64]


def prepare_row(x: Any, steps: Sequence[Step], key: DrawKey, row: int) -> Any:
    """One stored row through the row steps up to its pixels: a :class:`Frame` whose geometry is
    settled (every draw made, nothing decoded yet) or a numpy array."""
    for st in steps:
        t = st.transform
        rng = row_generator(key, row, st.index) if t.random else None
        if t.takes == "frame" and not isinstance(x, Frame):
            x = Frame.from_array(x)
        elif t.takes == "array" and isinstance(x, Frame):
            x = x.pixels()
        x = t.fn(x, st.params, rng)
    return x


def run_row(x: Any, steps: Sequence[Step], key: DrawKey, row: int) -> Any:
    """One stored row through the row steps; returns a numpy array."""
    x = prepare_row(x, steps, key, row)
    return x.pixels() if isinstance(x, Frame) else x


def fill_row(x: Any, steps: Sequence[Step], key: DrawKey, row: int, slot: npt.NDArray[Any]) -> None:
    """One stored row through the row steps, written into ``slot`` (its place in the message):
    a frame decodes and resamples straight into it."""
    x = prepare_row(x, steps, key, row)
    if isinstance(x, Frame):
        if (x.height, x.width, x.channels) != slot.shape:
            raise ValueError(f"a step made shape {(x.height, x.width, x.channels)}, the plan says {slot.shape}")
        x.render(slot)
        return
    if x.shape != slot.shape:
        raise ValueError(f"a step made shape {x.shape}, the plan says {slot.shape}")
    slot[...] = x


class _Busy:
    """Pool busy seconds over a sliding window -> busy ratio (busy / (workers * window))."""

    def __init__(self, workers: int, window_s: float = 10.0) -> None:
        self.workers, self.window_s = workers, window_s
        self._events: deque[tuple[float, float]] = deque()
        self._lock = threading.Lock()

    def add(self, busy_s: float) -> float:
        now = time.monotonic()
        with self._lock:
            self._events.append((now, busy_s))
            while self._events and self._events[0][0] < now - self.window_s:
                self._events.popleft()
            total = sum(b for _, b in self._events)
        return min(1.0, total / (self.workers * self.window_s))


class Transformer:
    """The node's transform service: the registry, the decode pool and the metrics hook."""

    def __init__(self, registry: Registry | None = None, workers: int = 1, metrics: Any = None) -> None:
        self.registry = registry or default_registry()
        self.workers = max(1, int(workers))
        self.metrics = metrics
        native.single_threaded()  # one image per pool thread; OpenCV's own threads would oversubscribe
        self._pool = (
            ThreadPoolExecutor(self.workers, thread_name_prefix="flightfeed-decode") if self.workers > 1 else None
        )
        self._busy = _Busy(self.workers)
        if metrics is not None:
            metrics.decode_workers.set(self.workers)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- planning -------------------------------------------------------------------------
    def plan(self, schema: pa.Schema, read: Any) -> Plan | None:
        return compile_plan(schema, read, self.registry)

    def resolve(self, read: Any) -> None:
        resolve_command(read, self.registry)

    # -- running --------------------------------------------------------------------------
    def message(
        self, ds: Dataset, plan: Plan, rows: _I64, columns: Sequence[str], key: DrawKey, batch_rows: int,
        *, with_index: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """The message of stored ``rows`` (in this order), transformed; ``with_index``: plus the
        int64 ``row_index`` column (``rows``), added before undecodable rows are dropped."""
        t0 = time.perf_counter()
        n = len(rows)
        schema = plan.schema(ds.project_schema(columns))
        made = {c.column for c in plan.columns if not c.deferred}
        made |= {n for c in plan.columns if c.deferred for n in (crop_name(c.column), flip_name(c.column))}
        rest_names = [f.name for f in schema if f.name not in made]
        rest = gather(ds, rows, rest_names) if rest_names else None
        arrays: dict[str, Any] = {}
        failed: dict[int, str] = {}
        busy = 0.0
        for cp in plan.columns:
            if cp.deferred:
                start = time.perf_counter()
                crop, flip, errs = _deferred_params(ds, cp, rows, key, schema.field(crop_name(cp.column)))
                arrays[crop_name(cp.column)], arrays[flip_name(cp.column)] = crop, flip
                busy += time.perf_counter() - start
                for i, msg in errs.items():
                    failed.setdefault(i, msg)
                continue
            arr, errs, b = self._column(ds, cp, rows, key)
            arrays[cp.column] = arr
            busy += b
            for i, msg in errs.items():
                failed.setdefault(i, msg)
        if failed and plan.on_error != "skip":
            i = min(failed)
            cid = int(ds.locate(rows[i : i + 1])[0][0])
            if self.metrics is not None:
                ratio = self._busy.add(busy)
                self.metrics.transformed(ds.name, 0, time.perf_counter() - t0, busy, ratio, len(failed), 0)
            raise ShardError(
                f"dataset {ds.name!r}: stored row {int(rows[i])} (shard {ds.chunk_shard(cid).uri}) failed to "
                f"transform: {failed[i]}; request on_decode_error='skip' to drop such rows (counted)"
            )
        cols = [arrays[f.name] if f.name in arrays else rest.column(f.name) for f in schema]  # type: ignore[union-attr]
        if with_index:
            cols.append(pa.array(rows, type=pa.int64()))
            schema = schema.append(pa.field(INDEX_COLUMN, pa.int64(), nullable=False))
        batch = pa.RecordBatch.from_arrays(cols, schema=schema)
        if self.metrics is not None:
            self.metrics.transformed(
                ds.name, n - len(failed), time.perf_counter() - t0, busy, self._busy.add(busy), len(failed), len(failed)
            )
        if not failed:
            yield batch
            return
        yield from _with_skips(batch, sorted(failed), batch_rows, schema)

    def _column(
        self, ds: Dataset, cp: ColumnPlan, rows: _I64, key: DrawKey
    ) -> tuple[Any, dict[int, str], float]:
        n = len(rows)
        source = _source(ds, cp, rows)
        out_t: Any = cp.arrow_type
        shape = tuple(int(d or 0) for d in cp.output.shape)
        dtype = np.dtype(cp.output.dtype)
        width = int(np.prod(shape)) if shape else 1
        buf = pa.allocate_buffer(max(1, n * width * dtype.itemsize))
        memory: Any = buf
        out = np.frombuffer(memory, dtype=dtype, count=n * width).reshape((n, *shape))
        errors: dict[int, str] = {}

        def work(lo_hi: tuple[int, int]) -> float:
            start = time.perf_counter()
            for i in range(*lo_hi):
                try:
                    fill_row(source(i), cp.row_steps, key, int(rows[i]), out[i])
                except Exception as exc:  # any failure of a sample is reported with its row
                    errors[i] = f"{type(exc).__name__}: {exc}"
                    out[i] = 0
            return time.perf_counter() - start

        per = _slice_rows(cp, n, self.workers)
        slices = [(lo, min(n, lo + per)) for lo in range(0, n, per)]
        busy = sum(self._pool.map(work, slices)) if self._pool is not None else sum(map(work, slices))
        for st in cp.message_steps:
            result = st.transform.fn(out, st.params, key)
            if result is not out:
                np.copyto(out, np.asarray(result).reshape(out.shape), casting="same_kind")
        leaf = pa.Array.from_buffers(pa.from_numpy_dtype(dtype), n * width, [None, buf])
        if isinstance(out_t, pa.FixedShapeTensorType):
            storage = pa.FixedSizeListArray.from_arrays(leaf, width)
            return pa.ExtensionArray.from_storage(out_t, storage), errors, busy
        return leaf, errors, busy


def _slice_rows(cp: ColumnPlan, n: int, workers: int) -> int:
    """Rows per task of the decode pool. An encoded image costs ~1 ms to decode and is a task of
    its own: a message waits for its slowest task, and tasks of 4 images left one thread finishing
    alone at the end of every message (bench_scaling's JPEG stage on the 2-core VM, one message at
    a time, 2 threads: 84 -> 90 MB/s encoded, speedup over 1 thread 1.58x -> 1.70x, medians of 4
    and 8 runs). Cheap per-row steps on decoded arrays go in slices of up to 8 rows, 4 tasks per
    thread, so a task's hand-over (~20 us) stays small beside its work."""
    if cp.source.kind == "bytes":
        return 1
    return max(1, min(8, n // (workers * 4) or 1))


def _deferred_params(
    ds: Dataset, cp: ColumnPlan, rows: _I64, key: DrawKey, crop_field: pa.Field[Any]
) -> tuple[Any, Any, dict[int, str]]:
    """Crop boxes and flips of a deferred column (headers only: ~tens of us per row, one thread)."""
    source = _source(ds, cp, rows)
    n = len(rows)
    crops = np.zeros((n, 4), dtype=np.int32)
    flips = np.zeros(n, dtype=bool)
    errors: dict[int, str] = {}
    for i in range(n):
        try:
            frame = prepare_row(source(i), cp.row_steps, key, int(rows[i]))
            (crops[i], flips[i]) = frame_params(frame)
        except Exception as exc:  # a header that does not parse: reported with its row
            errors[i] = f"{type(exc).__name__}: {exc}"
    crop, flip = params_arrays(crops, flips, crop_field)
    return crop, flip, errors


def _source(ds: Dataset, cp: ColumnPlan, rows: _I64) -> Any:
    """i -> the i-th row's input: a memoryview of encoded bytes, or a numpy row."""
    if cp.source.kind == "bytes":
        cid, local = ds.locate(rows)
        views: dict[int, tuple[memoryview, npt.NDArray[np.int64]]] = {}
        for c in np.unique(cid).tolist():
            arr: Any = ds.chunk(c).column(cp.column)
            large = pa.types.is_large_binary(arr.type)
            bufs = arr.buffers()
            offs = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + len(arr) + 1]
            # cast: a pyarrow buffer's memoryview is signed bytes ('b'); decoders want unsigned ('B')
            data = memoryview(bufs[2]).cast("B") if bufs[2] is not None else memoryview(b"")
            views[c] = (data, offs.astype(np.int64))

        def get_bytes(i: int) -> memoryview:
            data, offs = views[int(cid[i])]
            j = int(local[i])
            return data[int(offs[j]) : int(offs[j + 1])]

        return get_bytes
    column = gather(ds, rows, [cp.column]).column(0)
    flat: Any = column
    while isinstance(flat, pa.ExtensionArray | pa.FixedSizeListArray):
        flat = flat.storage if isinstance(flat, pa.ExtensionArray) else flat.flatten()
    values = flat.to_numpy(zero_copy_only=False).reshape((len(rows), *[int(d or 0) for d in cp.source.shape]))
    return lambda i: values[i]


def _with_skips(
    batch: pa.RecordBatch, failed: list[int], batch_rows: int, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """The message as client batches; a batch that lost rows carries a SkipInfo."""
    n = batch.num_rows
    bad = set(failed)
    clean_from = 0
    for lo in range(0, n, batch_rows):
        hi = min(n, lo + batch_rows)
        lost = [i for i in range(lo, hi) if i in bad]
        if not lost:
            continue
        if clean_from < lo:
            yield batch.slice(clean_from, lo - clean_from)
        keep = pa.array([i for i in range(lo, hi) if i not in bad], type=pa.int64())
        info = SkipInfo(positions=hi - lo, skipped=len(lost)).SerializeToString()
        meta = dict(schema.metadata or {})
        meta[SKIP_KEY] = info
        yield batch.take(keep).replace_schema_metadata(meta)
        clean_from = hi
    if clean_from < n:
        yield batch.slice(clean_from, n - clean_from)
