"""``--from hf``: a Hugging Face ``datasets`` folder written by ``save_to_disk`` (``state.json``,
``dataset_info.json`` and Arrow stream files ``data-XXXXX-of-NNNNN.arrow``).

Plain columns keep their Arrow type (such a folder is also served directly:
``flightfeed serve name=/path/to/hf_dir``). Features the client cannot take as they are map to:

- ``Image()`` / ``Audio()`` / ``Video()`` (``struct<bytes, path>``) -> ``NAME`` (binary: the
  encoded file, unchanged) and ``NAME_path`` (string, may be null). A row whose bytes are null
  (a feature that only points to a file) is a bad record named by file and row.
- ``ClassLabel(names=...)`` -> int64, the names kept in the schema metadata: ``flightfeed.classes``
  (the JSON list ``FlightDataset.classes`` returns) for the ``label`` column or the only
  ClassLabel, and ``flightfeed.class_names`` (JSON: column -> names) for every one.
- ``Array2D``..``Array5D`` of a fixed shape (stored as nested lists, which the client cannot take)
  -> a fixed-shape tensor column of that shape and dtype; a row that is null or of another shape
  is a bad record named by file and row. An array whose first dimension is ``None`` stays lists.
- ``Sequence``/``List`` features stay Arrow ``list`` columns (ragged on the client).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from flightfeed.server.tools.convert.sources.records import BadRecord
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["HfSource", "MEDIA_FEATURES", "ARRAY_FEATURES"]

MEDIA_FEATURES = ("Image", "Audio", "Video", "Pdf")
#: fixed-shape array features (stored as nested lists): a tensor column each
ARRAY_FEATURES = ("Array2D", "Array3D", "Array4D", "Array5D")


def _stream(source: pa.NativeFile, uri: str) -> Iterator[Any]:
    """The schema, then the record batches, of the Arrow stream file ``uri``; damage is named."""
    try:
        reader = ipc.open_stream(source)
        yield reader.schema
        yield from reader
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{uri}: not a readable Arrow stream file (damaged or truncated?): {exc}") from None


class HfSource:
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str) -> None:
        if on_bad_record not in ("error", "skip"):
            raise ConfigError(f"--on-bad-record {on_bad_record!r}: use 'error' or 'skip'")
        self._src = src.rstrip("/")
        self._on_bad = on_bad_record
        self._files = files
        if os.path.exists(os.path.join(self._src, "dataset_dict.json")) and not files.remote:
            raise ConfigError(f"{src} is a DatasetDict (dataset_dict.json): convert one split, e.g. {src}/train")
        self._folder = files.local_dir(self._src, ["state.json", "dataset_info.json"])
        meta_dir = self._folder.__enter__()
        try:
            with open(os.path.join(meta_dir, "state.json"), encoding="utf-8") as f:
                state = json.load(f)
            with open(os.path.join(meta_dir, "dataset_info.json"), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{src}: not a datasets save_to_disk folder (state.json, dataset_info.json): {exc}"
            ) from None
        finally:
            self._folder.__exit__(None, None, None)
        self.paths = [files.join(self._src, d["filename"]) for d in state.get("_data_files", [])]
        if not self.paths:
            raise DatasetError(f"{src}: state.json lists no data files")
        features: dict[str, Any] = info.get("features") or {}
        self._media = [n for n, f in features.items() if isinstance(f, dict) and f.get("_type") in MEDIA_FEATURES]
        #: Array2D..Array5D features of a fixed shape: NAME -> shape (stored as nested lists)
        self._arrays: dict[str, tuple[int, ...]] = {
            n: tuple(f["shape"])
            for n, f in features.items()
            if isinstance(f, dict)
            and f.get("_type") in ARRAY_FEATURES
            and all(isinstance(d, int) and d > 0 for d in f.get("shape", [None]))
        }
        labels = {n: f["names"] for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"}
        with files.local(self.paths[0]) as path, pa.memory_map(path) as source:
            batches = _stream(source, self.paths[0])
            stored = next(batches)
            probe = next(batches, None)
        assert isinstance(stored, pa.Schema)
        self._stored = stored
        self.row_bytes = 1 if probe is None or not probe.num_rows else max(1, probe.nbytes // probe.num_rows)
        fields: list[pa.Field[Any]] = []
        for field in stored:
            if field.name in self._media:
                if not pa.types.is_struct(field.type) or field.type.get_field_index("bytes") < 0:
                    raise DatasetError(
                        f"{src}: feature {field.name!r} is stored as {field.type}, not struct<bytes, path>"
                    )
                fields += [pa.field(field.name, pa.binary()), pa.field(f"{field.name}_path", pa.string())]
            elif field.name in self._arrays:
                fields.append(pa.field(field.name, _tensor_type(field, self._arrays[field.name], src)))
            else:
                fields.append(field.remove_metadata() if field.metadata else field)
        metadata: dict[bytes | str, bytes | str] = {"flightfeed.source": "huggingface"}
        if labels:
            main = "label" if "label" in labels else next(iter(labels)) if len(labels) == 1 else None
            if main is not None:
                metadata["flightfeed.classes"] = json.dumps(labels[main])
            metadata["flightfeed.class_names"] = json.dumps(labels)
        self.schema = pa.schema(fields, metadata=metadata)
        self.description = f"Hugging Face datasets ({len(self.paths)} file(s))"
        self.skipped: dict[str, str] = {}
        self.skipped_count = 0
        self._rows: int | None = None

    @property
    def num_rows(self) -> int:  # None until read: streamed like records.py
        return self._rows  # type: ignore[return-value]

    @property
    def manifest_extra(self) -> dict[str, object]:
        return {
            "bad_records": {"policy": self._on_bad, "skipped": self.skipped_count, "named": dict(self.skipped)},
            "huggingface": {"files": len(self.paths), "media_columns": self._media},
        }

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        self.skipped, self.skipped_count = {}, 0
        total = 0
        for uri in self.paths:
            with self._files.local(uri) as path, pa.memory_map(path) as source:
                first = 0
                stream = _stream(source, uri)
                next(stream)  # the schema
                for batch in stream:
                    if not batch.schema.equals(self._stored, check_metadata=False):
                        raise DatasetError(f"{uri} has another schema than {self.paths[0]}:\n{batch.schema}")
                    out = self._convert(batch, uri, first)
                    first += batch.num_rows
                    total += out.num_rows
                    yield out
        self._rows = total

    def _convert(self, batch: pa.RecordBatch, uri: str, first: int) -> pa.RecordBatch:
        keep: pa.Array[Any] | None = None
        for name in self._media:  # rows the converted columns cannot hold: named, then left out
            missing = pc.is_null(pc.struct_field(batch.column(name), "bytes"))
            if pc.any(missing).as_py():
                keep = self._bad_rows(missing, uri, first, keep, f"{name!r} has no bytes (only a path); re-save "
                                      "with embedded files")
        for name, shape in self._arrays.items():
            odd = pc.invert(_has_shape(_storage(batch.column(name)), shape))
            if pc.any(odd).as_py():
                keep = self._bad_rows(odd, uri, first, keep, f"{name!r} is null or not of its shape {list(shape)}")
        if keep is not None:
            batch = batch.filter(keep)
        columns: list[pa.Array[Any]] = []
        for field in batch.schema:
            column = batch.column(field.name)
            if field.name in self._arrays:
                tensor = self.schema.field(field.name).type
                columns.append(_as_tensor(_storage(column), tensor, self._arrays[field.name]))
            elif field.name in self._media:
                data = pc.struct_field(column, "bytes")
                path = (
                    pc.struct_field(column, "path")
                    if column.type.get_field_index("path") >= 0
                    else pa.nulls(len(column))
                )
                columns += [data.cast(pa.binary()), path.cast(pa.string())]
            else:
                columns.append(column)
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def _bad_rows(self, bad: pa.Array[Any], uri: str, first: int, keep: pa.Array[Any] | None, reason: str) -> Any:
        for row in pc.indices_nonzero(bad).to_pylist():
            record = BadRecord(f"{uri}: row {first + (row or 0)}", reason)
            if self._on_bad == "error":
                raise record.error()
            self.skipped_count += 1
            if len(self.skipped) < 1000:
                self.skipped[record.where] = record.reason
        mask = pc.invert(bad)
        return mask if keep is None else pc.and_(keep, mask)

    def close(self) -> None:
        pass


def _tensor_type(field: pa.Field[Any], shape: tuple[int, ...], src: str) -> pa.DataType:
    """The fixed-shape tensor type of an ArrayND feature stored as ``len(shape)`` nested lists."""
    value = field.type
    if isinstance(value, pa.BaseExtensionType):  # datasets' own ArrayND type, where datasets is imported
        value = value.storage_type
    for _ in shape:
        if not (pa.types.is_list(value) or pa.types.is_large_list(value) or pa.types.is_fixed_size_list(value)):
            raise DatasetError(
                f"{src}: feature {field.name!r} is stored as {field.type}, not {len(shape)} nested lists"
            )
        value = value.value_type
    return pa.fixed_shape_tensor(value, list(shape))


def _storage(column: Any) -> Any:
    return column.storage if isinstance(column, pa.ExtensionArray) else column


def _has_shape(column: Any, shape: tuple[int, ...]) -> pa.Array[Any]:
    """Per row: not null, and every nested list of the length its dimension says, no null number."""
    ok = np.asarray(column.is_valid(), dtype=bool).copy()
    level = column
    parents = np.arange(len(column))  # the row of each list at this level
    for dim in shape:
        lengths = pc.fill_null(pc.list_value_length(level), -1).to_numpy(zero_copy_only=False)
        ok[parents[lengths != dim]] = False
        parents = parents[pc.list_parent_indices(level).to_numpy(zero_copy_only=False)]
        level = pc.list_flatten(level)
    ok[parents[~np.asarray(level.is_valid(), dtype=bool)]] = False
    out: pa.Array[Any] = pa.array(ok)
    return out


def _as_tensor(column: Any, typ: Any, shape: tuple[int, ...]) -> pa.Array[Any]:
    """The rows (each of ``shape``, no nulls: checked) as a fixed-shape tensor column."""
    values = column
    for _ in shape:
        values = values.flatten()  # flatten() honours a slice's offset
    storage = pa.FixedSizeListArray.from_arrays(values, int(np.prod(shape)))
    out: pa.Array[Any] = pa.ExtensionArray.from_storage(typ, storage)
    return out
