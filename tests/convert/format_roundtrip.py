"""Helpers of the ``--from webdataset|lmdb|tfrecord|mds|litdata|hf`` tests: convert, then read
every row back through a real server and ``FlightDataset`` (or the converted shards)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from PIL import Image

from flightfeed.server.storage.manifest import Manifest
from flightfeed.server.testing import running_server
from flightfeed.server.tools.convert import ConvertSettings, convert

__all__ = ["jpeg", "convert_to", "served_rows", "arrow_rows", "import_hf_datasets"]


def import_hf_datasets() -> Any:
    """Hugging Face ``datasets``, or a skip: pytest puts tests/ on sys.path, where tests/support/datasets.py
    (``tests.support.datasets``) would shadow it under the bare name."""
    import importlib
    import os
    import sys

    import pytest

    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = sys.modules.get("datasets")
    if found is not None and os.path.abspath(getattr(found, "__file__", "") or "").startswith(tests_dir + os.sep):
        del sys.modules["datasets"]
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != tests_dir]
    try:
        return importlib.import_module("datasets")
    except ImportError as exc:
        pytest.skip(f"Hugging Face datasets is not installed ({exc}): pip install datasets", allow_module_level=True)
    finally:
        sys.path[:] = saved


def jpeg(seed: int, width: int = 40, height: int = 32) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def convert_to(src: str | Path, dst: str | Path, kind: str, **kw: Any) -> Manifest:
    shard_bytes = kw.pop("shard_bytes", 64 << 10)
    settings = ConvertSettings(progress=False, kind=kind, shard_bytes=shard_bytes, **kw)  # type: ignore[arg-type]
    return convert(str(src), str(dst), settings)


def served_rows(dst: Path | str, columns: list[str] | None = None, batch_size: int = 7) -> dict[str, list[Any]]:
    """Every row of the converted dataset at ``dst`` in stored order, through a server and FlightDataset."""
    from flightfeed.client import FlightDataset, ReadOptions

    out: dict[str, list[Any]] = {}
    with running_server({"d": str(dst)}) as server:
        ds = FlightDataset(
            server.location,
            "d",
            columns=columns,
            batch_size=batch_size,
            shuffle=False,
            options=ReadOptions(streams=2, report_interval=None),
        )
        for batch in ds:
            for name, value in batch.items():
                out.setdefault(name, []).extend(value if isinstance(value, list) else value.tolist())
    return out


def arrow_rows(dst: Path) -> pa.Table:
    """The converted shards read with pyarrow (for list columns: checked at the Arrow level)."""
    tables = [ipc.open_file(str(p)).read_all() for p in sorted(dst.glob("part-*.arrow"))]
    return pa.concat_tables(tables)
