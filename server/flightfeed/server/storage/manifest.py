"""``manifest.json``: what ``flightfeed convert`` wrote (schema, and per shard its rows, bytes,
sha256, record-batch sizes and the checksums of its fixed-size blocks, ``blocks``: see
``readers.blocks``; manifests written before block checksums existed have none).

A manifest lets a server open remote ``.arrow`` shards lazily: the catalog gets the schema, row
counts and chunk offsets without downloading anything, and each shard is fetched into the cache
on its first read (and checked against the manifest's sha256 then).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.blocks import BlockSums
from flightfeed.wire.errors import DatasetError

__all__ = ["MANIFEST_NAME", "MANIFEST_FORMAT", "Manifest", "ManifestShard"]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "flightfeed.manifest/1"


@dataclass(frozen=True)
class ManifestShard:
    """One shard as written: ``name`` is its path relative to the dataset root."""

    name: str
    rows: int
    bytes: int
    sha256: str
    batch_rows: tuple[int, ...]
    blocks: BlockSums | None = None


@dataclass
class Manifest:
    schema: pa.Schema
    shards: list[ManifestShard]
    compression: str = "none"
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def nbytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        doc = {
            "format": MANIFEST_FORMAT,
            "rows": self.rows,
            "bytes": self.nbytes,
            "compression": self.compression,
            "source": self.source,
            "schema_text": [f"{f.name}: {f.type}" for f in self.schema],
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
            "shards": [
                {
                    "name": s.name,
                    "rows": s.rows,
                    "bytes": s.bytes,
                    "sha256": s.sha256,
                    "batch_rows": list(s.batch_rows),
                    **({"blocks": s.blocks.to_json()} if s.blocks is not None else {}),
                }
                for s in self.shards
            ],
            **self.extra,
        }
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> Manifest:
        """Parse a manifest; ``where`` names it in errors."""
        try:
            doc = json.loads(text)
            if doc.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {MANIFEST_FORMAT!r}")
            schema = ipc.read_schema(pa.py_buffer(base64.b64decode(doc["schema"])))
            shards = [
                ManifestShard(
                    name=str(s["name"]),
                    rows=int(s["rows"]),
                    bytes=int(s["bytes"]),
                    sha256=str(s["sha256"]),
                    batch_rows=tuple(int(n) for n in s["batch_rows"]),
                    blocks=BlockSums.from_json(s["blocks"], f"{where}: shard {s['name']}") if "blocks" in s else None,
                )
                for s in doc["shards"]
            ]
        except (ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as exc:
            raise DatasetError(
                f"{where} is not a valid flightfeed manifest ({exc}); delete it or re-run `flightfeed convert`"
            ) from None
        for s in shards:
            if sum(s.batch_rows) != s.rows:
                listed = sum(s.batch_rows)
                raise DatasetError(f"{where}: shard {s.name} lists batches of {listed} rows, not {s.rows}")
        known = {"format", "rows", "bytes", "compression", "source", "schema_text", "schema", "shards"}
        extra = {k: v for k, v in doc.items() if k not in known}
        return cls(schema, shards, str(doc.get("compression", "none")), str(doc.get("source", "")), extra)
