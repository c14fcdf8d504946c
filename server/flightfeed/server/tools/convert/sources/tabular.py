"""What ``flightfeed convert`` reads: HDF5, Parquet and NumPy sources as record batches.

A source is one file, a directory (searched recursively, hidden entries skipped) or a glob, of
one kind. Image folders live in ``images.py``. Every source yields batches of exactly the rows
asked for (the last one may be shorter), in a stable order: files sorted by path, rows in order.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from flightfeed.server.readers import HDF5_SUFFIXES
from flightfeed.server.readers.ndarray import arrow_type_for, column_from_ndarray, unsupported_dtype_reason
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["Source", "HDF5_SUFFIXES", "find_files", "Hdf5Source", "ParquetSource", "NumpySource"]


class Source(Protocol):
    description: str
    schema: pa.Schema

    @property
    def num_rows(self) -> int: ...  # final once batches() is exhausted (image folders may skip files)

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]: ...

    def close(self) -> None: ...


def find_files(src: str, suffixes: tuple[str, ...]) -> list[str]:
    """Files under ``src`` (a file, directory or glob) ending in ``suffixes``, sorted by path."""
    if any(ch in src for ch in "*?["):
        files = [f for f in glob.glob(src, recursive=True) if os.path.isfile(f)]
    elif os.path.isdir(src):
        files = []
        for root, dirs, names in os.walk(src):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            files.extend(os.path.join(root, n) for n in names if not n.startswith("."))
    else:
        files = [src] if os.path.isfile(src) else []
    return sorted(f for f in files if f.lower().endswith(suffixes))


def _same_schema(first: pa.Schema, other: pa.Schema, first_name: str, other_name: str) -> None:
    if not other.equals(first, check_metadata=False):
        raise DatasetError(
            f"{other_name} has a different schema than {first_name}; a converted dataset has one schema.\n"
            f"  {first_name}: {first}\n  {other_name}: {other}"
        )


class Hdf5Source:
    """HDF5 files; the columns of ``group`` (default: the only group with row-aligned datasets)."""

    def __init__(
        self, files: list[str], group: str | None, casts: Mapping[str, str], datasets: Sequence[str] | None = None
    ) -> None:
        from flightfeed.server.readers.hdf5.reader import Hdf5Shard

        self.description = f"HDF5 ({len(files)} file(s))"
        self._shards: list[Hdf5Shard] = []
        try:
            for path in files:
                self._shards.append(Hdf5Shard(path, group=group, casts=casts, datasets=datasets))
                _same_schema(self._shards[0].schema, self._shards[-1].schema, files[0], path)
        except BaseException:
            self.close()
            raise
        self.schema = self._shards[0].schema
        self.num_rows = sum(s.num_rows for s in self._shards)

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for shard in self._shards:
            for start in range(0, shard.num_rows, rows):
                yield shard.read_rows(start, min(start + rows, shard.num_rows))

    def close(self) -> None:
        for shard in self._shards:
            shard.close()


class ParquetSource:
    """Parquet files, read batch by batch."""

    def __init__(self, files: list[str]) -> None:
        self.description = f"Parquet ({len(files)} file(s))"
        self._paths = files
        self._files = [_parquet_file(f) for f in files]
        for f, path in zip(self._files, files, strict=True):
            _same_schema(self._files[0].schema_arrow, f.schema_arrow, files[0], path)
        self.schema = self._files[0].schema_arrow
        self.num_rows = sum(f.metadata.num_rows for f in self._files)

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for f, path in zip(self._files, self._paths, strict=True):
            try:
                yield from f.iter_batches(batch_size=rows, use_threads=True)
            except (pa.ArrowException, OSError) as exc:
                raise DatasetError(f"{path}: {_DAMAGED_PARQUET} ({exc})") from None

    def close(self) -> None:
        for f in self._files:
            f.close()


_DAMAGED_PARQUET = "not a readable Parquet file (damaged or truncated?); write it again or move it out of SRC"


def _parquet_file(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path, memory_map=True)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: {_DAMAGED_PARQUET} ({exc})") from None


class NumpySource:
    """``.npy`` files (a column each, named by the file stem) or one ``.npz`` (a column per array).

    Arrays load without pickle; ``.npy`` files are memory-mapped. 1-d arrays become primitive
    columns, N-d arrays tensor columns; all must share their first dimension.
    """

    def __init__(self, files: list[str]) -> None:
        self.description = f"NumPy ({len(files)} file(s))"
        arrays: dict[str, npt.NDArray[Any]] = {}
        for path in files:
            if path.lower().endswith(".npz"):
                with np.load(path, allow_pickle=False) as archive:
                    for key in archive.files:
                        self._add(arrays, key, archive[key], path)
            else:
                stem = os.path.splitext(os.path.basename(path))[0]
                self._add(arrays, stem, np.load(path, mmap_mode="r", allow_pickle=False), path)
        lengths = {k: a.shape[0] for k, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{k}: {n}" for k, n in lengths.items())
            raise DatasetError(f"NumPy arrays have different first dimensions ({shown}); columns need one row count")
        self._arrays = arrays
        self._types = {k: arrow_type_for(a.dtype, a.shape[1:]) for k, a in arrays.items()}
        self.schema = pa.schema([pa.field(k, t) for k, t in self._types.items()])
        self.num_rows = next(iter(lengths.values()))

    @staticmethod
    def _add(arrays: dict[str, npt.NDArray[Any]], key: str, array: npt.NDArray[Any], path: str) -> None:
        if key in arrays:
            raise DatasetError(f"{path}: column {key!r} is given twice; rename one of the arrays")
        if array.ndim == 0:
            raise DatasetError(f"{path}: array {key!r} is a scalar; columns need a first (row) dimension")
        why = unsupported_dtype_reason(array.dtype)
        if why is not None:
            raise DatasetError(f"{path}: array {key!r} has {why}; only fixed-size numeric/bool arrays convert")
        arrays[key] = array

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, self.num_rows, rows):
            stop = min(start + rows, self.num_rows)
            columns = [column_from_ndarray(np.asarray(a[start:stop]), self._types[k]) for k, a in self._arrays.items()]
            yield pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def close(self) -> None:
        self._arrays = {}


def require(files: list[str], src: str, what: str, suffixes: tuple[str, ...]) -> list[str]:
    if not files:
        if "://" not in src and not any(ch in src for ch in "*?[{") and not os.path.exists(src):
            raise ConfigError(f"{src}: no such file or directory")  # a typo, not a folder without such files
        raise ConfigError(f"{src}: no {what} files found (looked for {', '.join(suffixes)})")
    return files
