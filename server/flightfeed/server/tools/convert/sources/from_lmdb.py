"""``--from lmdb``: an LMDB environment (a directory with ``data.mdb``, or the file itself).

``--lmdb-decoder msgpack`` (default): the layout of the LMDB ImageNet recipes: records under
decimal keys ``"0".."N-1"``, each a msgpack array ``(image_bytes, label)`` (columns ``image``
binary and ``label`` int64) or a msgpack map (a column per key; bytes -> binary, int -> int64,
float -> float64, str -> string), plus ``__len__`` (N as ASCII decimal or msgpack). Rows follow
the key's number. ``__len__`` must be there and agree with the records found.

``--lmdb-decoder raw``: every key that is not a ``__dunder__`` in LMDB key order; columns ``key``
(binary) and ``value`` (binary, unchanged).

Values are read through one read transaction held for the conversion (``buffers=True``): a
record in the recipe's exact encoding (a msgpack ``bin`` and an integer) is taken apart without
msgpack and its image handed on as a view into the map, so its bytes are copied once, into the
record batch; anything else is decoded by msgpack.

Pickled values are refused in both modes (a pickle protocol 2+ header ``\\x80 N`` ... ``.``):
flightfeed never unpickles. A value that does not decode, or a missing key, is a bad record
named by environment and key.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from flightfeed.server.tools.convert.sources.records import BadRecord, RecordSource
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["LmdbSource", "LMDB_DECODERS", "looks_like_pickle"]

LMDB_DECODERS = ("msgpack", "raw")
_PY_TYPES: dict[type, pa.DataType] = {bytes: pa.binary(), int: pa.int64(), float: pa.float64(), str: pa.string()}
#: msgpack bin8/16/32 headers: (bytes of the length field); the integers: (size, struct code)
_BIN_LENGTH = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_INTS = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}


def recipe_pair(value: memoryview) -> tuple[memoryview, int] | None:
    """``(image view, label)`` when ``value`` is exactly the msgpack array ``[bin, int]`` (the
    recipe's layout); None for any other value (msgpack decodes those)."""
    n = len(value)
    if n < 3 or value[0] != 0x92:
        return None
    width = _BIN_LENGTH.get(value[1])
    if width is None or n < 2 + width:
        return None
    start = 2 + width
    size = int.from_bytes(value[2:start], "big")
    end = start + size
    if end >= n:
        return None
    tag = value[end]
    if tag <= 0x7F or tag >= 0xE0:  # positive / negative fixint
        return (value[start:end], tag if tag <= 0x7F else tag - 0x100) if end + 1 == n else None
    code = _INTS.get(tag)
    if code is None or end + 1 + struct.calcsize(code) != n:
        return None
    return value[start:end], int(struct.unpack_from(code, value, end + 1)[0])


def _is_dunder(key: bytes) -> bool:
    """``__len__``, ``__keys__``: the recipes' metadata keys (``--lmdb-decoder raw`` leaves them out;
    a key such as ``__0001`` that only starts with ``__`` is a record)."""
    return len(key) > 4 and key.startswith(b"__") and key.endswith(b"__")


def looks_like_pickle(value: bytes | memoryview) -> bool:
    """A pickle of protocol 2..5 starts with PROTO (0x80, then the protocol) and ends with STOP."""
    return len(value) > 2 and value[0] == 0x80 and 2 <= value[1] <= 5 and value[-1] == 0x2E


def _pickle_error(where: str) -> ConfigError:
    return ConfigError(
        f"{where} holds a pickled value; flightfeed never unpickles (it runs code from the file). Re-write "
        "the database with msgpack'd (image_bytes, label) values or raw bytes, then convert with "
        "--lmdb-decoder msgpack|raw"
    )


class LmdbSource(RecordSource):
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str, decoder: str = "msgpack") -> None:
        super().__init__(on_bad_record)
        if decoder not in LMDB_DECODERS:
            if decoder == "pickle":
                raise ConfigError("--lmdb-decoder pickle is refused: flightfeed never unpickles; use msgpack or raw")
            raise ConfigError(f"--lmdb-decoder {decoder!r}: use msgpack or raw")
        try:
            import lmdb
            import msgpack  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"--from lmdb needs the lmdb and msgpack packages ({exc}): pip install 'flightfeed[formats]'"
            ) from None

        self._decoder = decoder
        self._src = src
        self._copy = files.local_dir(src, ["data.mdb", "lock.mdb"]) if files.remote else None
        path = self._copy.__enter__() if self._copy is not None else src
        subdir = os.path.isdir(path)
        if not os.path.exists(os.path.join(path, "data.mdb") if subdir else path):
            raise ConfigError(f"{src}: no LMDB environment here (expected a directory with data.mdb)")
        try:
            self._env = lmdb.open(path, subdir=subdir, readonly=True, lock=False, readahead=True, max_readers=4)
        except lmdb.Error as exc:
            raise DatasetError(f"{src}: not a readable LMDB environment: {exc}") from None
        self._check_size(os.path.join(path, "data.mdb") if subdir else path)
        self.description = f"LMDB ({decoder})"
        self._count = self._check_len() if decoder == "msgpack" else 0
        self._rows = self._count or None  # the progress bar's total; final once read
        self._names: list[str] = []
        self._types: list[type] = []
        self._txn: Any = None  # the read transaction of _read (its views stay valid until close)
        first = self._first_value()
        if decoder == "msgpack":
            self.schema = self._schema_of(first)
        else:
            self.schema = pa.schema([pa.field("key", pa.binary()), pa.field("value", pa.binary())])
        self.schema = self.schema.with_metadata({"flightfeed.source": "lmdb"})
        if decoder == "msgpack":
            self._types = [_PY_TYPES_INV[f.type] for f in self.schema]
        self.first_record()
        self.extra = {"lmdb": {"decoder": decoder}}

    def _check_size(self, data_path: str) -> None:
        """A data.mdb shorter than the pages its meta page names (an interrupted copy or download)
        would kill the process with SIGBUS on the first read past its end: refuse it by name."""
        pages = (int(self._env.info()["last_pgno"]) + 1) * int(self._env.stat()["psize"])
        size = os.path.getsize(data_path)
        if size < pages:
            self._env.close()
            raise DatasetError(
                f"{self._src}: {os.path.basename(data_path)} holds {size} bytes but its pages reach byte {pages}: "
                "the file is truncated (an incomplete copy or download?); copy the environment again"
            )

    def _where(self, key: bytes) -> str:
        return f"{self._src}: key {key.decode('utf-8', 'replace')!r}"

    def _check_len(self) -> int:
        import msgpack

        with self._env.begin(buffers=False) as txn:
            raw = txn.get(b"__len__")
            entries = self._env.stat()["entries"]
            dunders = sum(1 for k in txn.cursor().iternext(keys=True, values=False) if _is_dunder(k))
        if raw is None:
            raise DatasetError(
                f"{self._src}: no __len__ key; the msgpack layout has records under keys '0'..'N-1' and N under "
                "__len__ (convert with --lmdb-decoder raw to take every key as it is)"
            )
        if looks_like_pickle(raw):
            raise _pickle_error(f"{self._src}: key '__len__'")
        found = entries - dunders
        readings: list[int] = []
        if raw.strip().isdigit():
            readings.append(int(raw))
        try:
            value = msgpack.unpackb(raw)
            if isinstance(value, int):
                readings.append(value)
        except (ValueError, msgpack.UnpackException):
            pass
        if found in readings:
            return found
        raise DatasetError(
            f"{self._src}: __len__ says {readings[0] if readings else raw[:20]!r} but the database holds {found} "
            "records; the database is incomplete or __len__ is stale"
        )

    def _first_value(self) -> bytes:
        with self._env.begin(buffers=False) as txn:
            if self._decoder == "msgpack":
                value = txn.get(b"0")
                if value is None:
                    raise DatasetError(f"{self._src}: no key '0'; the msgpack layout numbers records from '0'")
                return bytes(value)
            for key, value in txn.cursor():
                if not _is_dunder(key):
                    return bytes(value)
        raise DatasetError(f"{self._src}: the database holds no records")

    def _schema_of(self, value: bytes) -> pa.Schema:
        decoded = self._decode(b"0", value)
        if isinstance(decoded, BadRecord):
            raise DatasetError(f"bad record {decoded.where}: {decoded.reason}")
        if self._names:
            return pa.schema([pa.field(n, _PY_TYPES[type(v)]) for n, v in zip(self._names, decoded, strict=True)])
        raise AssertionError("unreachable")

    def _decode(self, key: bytes, value: bytes | memoryview) -> Sequence[Any] | BadRecord:
        import msgpack

        if looks_like_pickle(value):
            raise _pickle_error(self._where(key))
        try:
            obj = msgpack.unpackb(value, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            return BadRecord(self._where(key), f"not a msgpack value ({type(exc).__name__}: {exc})")
        if isinstance(obj, dict):
            names, values = [str(k) for k in obj], list(obj.values())
        elif isinstance(obj, list) and len(obj) == 2:
            names, values = ["image", "label"], obj
        elif isinstance(obj, list):
            names, values = [f"field{i}" for i in range(len(obj))], obj
        else:
            return BadRecord(
                self._where(key), f"a msgpack {type(obj).__name__}; expected (image_bytes, label) or a map"
            )
        bad = next((v for v in values if type(v) not in _PY_TYPES), None)
        if bad is not None:
            return BadRecord(self._where(key), f"holds a {type(bad).__name__}; values must be bytes, int, float or str")
        if not self._names:
            self._names = names
        elif names != self._names and isinstance(obj, dict) and sorted(names) == sorted(self._names):
            by_name = dict(zip(names, values, strict=True))  # a map: the same keys in another order
            values = [by_name[n] for n in self._names]
        elif names != self._names:
            return BadRecord(self._where(key), f"fields {names} differ from the first record's {self._names}")
        if self._types and [type(v) for v in values] != self._types:
            got = [type(v).__name__ for v in values]
            want = [t.__name__ for t in self._types]
            return BadRecord(self._where(key), f"value types {got} differ from the first record's {want}")
        return values

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        import lmdb

        try:
            yield from self._read()
        except lmdb.Error as exc:
            raise DatasetError(f"{self._src}: the LMDB environment cannot be read ({exc}); is it damaged?") from None

    def _read(self) -> Iterator[Sequence[Any] | BadRecord]:
        if self._txn is None:  # values are views into the map, valid while this transaction lives
            self._txn = self._env.begin(buffers=True)
        txn = self._txn
        if self._decoder == "raw":
            for view, value in txn.cursor():
                key = bytes(view)
                if _is_dunder(key):
                    continue
                if looks_like_pickle(value):
                    raise _pickle_error(self._where(key))
                yield key, value
            return
        get = txn.get
        fast = self._names == ["image", "label"] and self._types == [bytes, int]
        for i in range(self._count):
            key = str(i).encode()
            found = get(key)
            if found is None:
                yield BadRecord(self._where(key), "is missing (the msgpack layout needs keys '0'..'N-1')")
                continue
            pair = recipe_pair(found) if fast else None
            yield pair if pair is not None else self._decode(key, found)

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None
        self._env.close()
        if self._copy is not None:
            self._copy.__exit__(None, None, None)


_PY_TYPES_INV = {v: k for k, v in _PY_TYPES.items()}
