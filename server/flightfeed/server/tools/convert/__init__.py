"""``flightfeed convert SRC DST``: HDF5, Parquet, NumPy (.npy/.npz), image folders and the formats of
other loaders (WebDataset, LMDB, TFRecord, MosaicML MDS, LitData, Hugging Face ``datasets``:
``formats.py``) into sharded ``.arrow`` files (Arrow IPC file format) plus ``manifest.json``; SRC
(for those formats) and DST may be ``s3://bucket/prefix``.

Library entry points: ``convert(src, dst, ConvertSettings(...))``; ``convert_splits`` for a folder of
split folders (``train/``, ``val/``: one dataset each). The subcommand lives in
``flightfeed.server.tools.convert.cli`` (``add_arguments``/``run``, re-exported here).
"""

from __future__ import annotations

from flightfeed.server.tools.convert.cli import add_arguments, run
from flightfeed.server.tools.convert.pipeline import ConvertSettings, convert
from flightfeed.server.tools.convert.sources.splits import convert_splits

__all__ = ["convert", "convert_splits", "ConvertSettings", "add_arguments", "run"]
