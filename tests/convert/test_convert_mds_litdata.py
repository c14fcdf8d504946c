"""``flightfeed convert --from mds|litdata``: datasets written by the real ``mosaicml-streaming``
(``MDSWriter``) and ``litdata`` (``BinaryWriter``, what ``optimize`` runs) come back value for
value; a damaged shard is a named bad record."""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flightfeed.wire.errors import ConfigError, DatasetError
from tests.convert.format_roundtrip import arrow_rows, convert_to, jpeg, served_rows


def mds_writer() -> Any:
    """``MDSWriter`` without ``streaming/__init__`` (which imports transformers, not installed
    here: mosaicml-streaming pins numpy<2.2 and is installed with --no-deps, see pyproject)."""
    loaded = sys.modules.get("streaming")
    if loaded is not None:
        root = next(iter(loaded.__path__))
    else:
        spec = importlib.util.find_spec("streaming")
        if spec is None or spec.origin is None:
            pytest.skip("mosaicml-streaming is not installed (pip install --no-deps mosaicml-streaming zstd xxhash)")
        root = os.path.dirname(spec.origin)
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    try:
        from streaming.base.format.mds.writer import MDSWriter
    except ImportError as exc:
        pytest.skip(f"mosaicml-streaming's MDSWriter does not import here: {exc}")
    return MDSWriter


def test_mds_round_trip(tmp_path: Path) -> None:
    writer = mds_writer()
    columns = {
        "image": "jpeg",
        "label": "int",
        "vec": "ndarray:float32:3",
        "dyn": "ndarray:int16",
        "text": "str",
        "raw": "bytes",
        "f": "float32",
        "u": "uint8",
        "meta": "json",
        "pix": "pil",
        "png": "png",
    }
    samples = []
    with writer(out=str(tmp_path / "mds"), columns=columns, compression="zstd", size_limit=1 << 14) as out:
        for i in range(20):
            img = Image.fromarray(np.random.default_rng(i).integers(0, 255, (6, 5, 3), dtype=np.uint8))
            sample = {
                "image": img,
                "label": i * 7 - 3,
                "vec": np.arange(3, dtype=np.float32) / (i + 1),
                "dyn": np.full((2, 1 + i % 3), i, np.int16),
                "text": f"t{i}",
                "raw": bytes(range(i)),
                "f": np.float32(i / 3),
                "u": np.uint8(i),
                "meta": {"i": i},
                "pix": img,
                "png": img,
            }
            out.write(sample)
            samples.append(sample)
    manifest = convert_to(tmp_path / "mds", tmp_path / "out", "auto")
    assert manifest.rows == 20 and manifest.extra["mds"]["shards"] > 1
    got = served_rows(tmp_path / "out", ["label", "text", "raw", "f", "u", "meta", "vec", "image", "pix", "png"])
    assert got["label"] == [s["label"] for s in samples]
    assert got["text"] == [s["text"] for s in samples] and got["raw"] == [s["raw"] for s in samples]
    assert got["f"] == [float(s["f"]) for s in samples] and got["u"] == [int(s["u"]) for s in samples]
    assert [eval_json(m) for m in got["meta"]] == [s["meta"] for s in samples]
    assert np.array_equal(np.array(got["vec"], np.float32), np.stack([s["vec"] for s in samples]))
    for k, s in enumerate(samples):  # images: decoded pixels as the writer stored them
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(got["pix"][k]))), np.asarray(s["pix"]))
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(got["png"][k]))), np.asarray(s["png"]))
        assert got["image"][k][:2] == b"\xff\xd8"
    table = arrow_rows(tmp_path / "out")
    for k, s in enumerate(samples):
        shape = table.column("dyn_shape")[k].as_py()
        assert np.array_equal(np.array(table.column("dyn")[k].as_py(), np.int16).reshape(shape), s["dyn"])


def eval_json(text: str) -> Any:
    import json

    return json.loads(text)


@pytest.mark.parametrize("kind", ["mds", "litdata"])
@pytest.mark.parametrize(
    ("text", "says"),
    [("{not json", "not a readable"), ("[1, 2]", r"not a \w+ index.json \(a JSON object is expected\)")],
)
def test_an_unreadable_index_json_is_named(tmp_path: Path, kind: str, text: str, says: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.json").write_text(text)
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'src' / 'index.json'}: {says}"):
        convert_to(tmp_path / "src", tmp_path / "out", kind)


def test_mds_pickle_columns_are_refused(tmp_path: Path) -> None:
    writer = mds_writer()
    with writer(out=str(tmp_path / "mds"), columns={"x": "pkl"}) as out:
        out.write({"x": {"a": 1}})
    with pytest.raises(ConfigError, match=r"MDS column 'x' is pickled"):
        convert_to(tmp_path / "mds", tmp_path / "out", "mds")


litdata_writer = pytest.importorskip(
    "litdata.streaming.writer", reason="litdata is not installed (pip install --no-deps litdata)"
)


def write_litdata(path: Path, n: int) -> list[dict[str, Any]]:
    writer = litdata_writer.BinaryWriter(str(path), chunk_bytes=2000)
    items = []
    for i in range(n):
        item = {
            "image": jpeg(i, 12, 10),
            "label": i,
            "arr": np.arange(4, dtype=np.int32) + i,
            "name": f"n{i}",
            "score": i / 7,
            "pair": (i, f"p{i}"),
        }
        writer[i] = item
        items.append(item)
    writer.done()
    writer.merge()
    return items


def test_litdata_round_trip(tmp_path: Path) -> None:
    items = write_litdata(tmp_path / "lit", 25)
    manifest = convert_to(tmp_path / "lit", tmp_path / "out", "auto")
    assert manifest.rows == 25 and manifest.extra["litdata"]["chunks"] > 1
    got = served_rows(tmp_path / "out", ["image", "label", "name", "score", "pair.0", "pair.1"])
    for key in ("image", "label", "name", "score"):
        assert got[key] == [it[key] for it in items], key
    assert list(zip(got["pair.0"], got["pair.1"], strict=True)) == [it["pair"] for it in items]
    table = arrow_rows(tmp_path / "out")
    assert table.column("arr").to_pylist() == [it["arr"].tolist() for it in items]


def test_a_damaged_litdata_chunk_is_named(tmp_path: Path) -> None:
    write_litdata(tmp_path / "lit", 25)
    chunk = sorted((tmp_path / "lit").glob("chunk-*.bin"))[1]
    chunk.write_bytes(chunk.read_bytes()[:-40])
    with pytest.raises(DatasetError, match=rf"{chunk.name}: item \d+: does not decode"):
        convert_to(tmp_path / "lit", tmp_path / "out", "litdata")


def test_mds_text_number_and_image_list_encodings(tmp_path: Path) -> None:
    from decimal import Decimal

    writer = mds_writer()
    columns = {"imgs": "list[jpeg]", "si": "str_int", "sf": "str_float", "sd": "str_decimal", "i64": "int64"}
    frames = [Image.fromarray(np.full((4, 6, 3), k * 40, np.uint8)) for k in range(3)]
    with writer(out=str(tmp_path / "mds"), columns=columns, compression="gz") as out:
        for i in range(6):
            out.write({"imgs": frames[: i % 3 + 1], "si": i * 11, "sf": i / 8, "sd": Decimal(f"{i}.25"),
                       "i64": np.int64(-(2**40) - i)})
    manifest = convert_to(tmp_path / "mds", tmp_path / "out", "mds")
    table = arrow_rows(tmp_path / "out")
    assert manifest.rows == 6 and str(manifest.schema.field("imgs").type) == "list<item: binary>"
    assert table.column("si").to_pylist() == [i * 11 for i in range(6)]
    assert table.column("sf").to_pylist() == [i / 8 for i in range(6)]
    assert table.column("sd").to_pylist() == [f"{i}.25" for i in range(6)]
    assert table.column("i64").to_pylist() == [-(2**40) - i for i in range(6)]
    for i, images in enumerate(table.column("imgs").to_pylist()):
        assert images is not None and len(images) == i % 3 + 1 and all(b[:2] == b"\xff\xd8" for b in images)


def test_a_damaged_mds_shard_is_named(tmp_path: Path) -> None:
    writer = mds_writer()
    with writer(out=str(tmp_path / "mds"), columns={"x": "bytes", "n": "int"}, size_limit=1 << 12) as out:
        for i in range(40):
            out.write({"x": bytes(100 + i), "n": i})
    shard = tmp_path / "mds" / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-30])
    with pytest.raises(DatasetError, match=r"shard\.00001\.mds: sample \d+: does not decode"):
        convert_to(tmp_path / "mds", tmp_path / "out", "mds")
    manifest = convert_to(tmp_path / "mds", tmp_path / "out2", "mds", on_bad_record="skip")
    bad: Any = manifest.extra["bad_records"]
    assert manifest.rows == 40 - bad["skipped"] and manifest.rows < 40


def test_litdata_numpy_and_tensor_leaves_keep_their_shapes(tmp_path: Path) -> None:
    import torch

    writer = litdata_writer.BinaryWriter(str(tmp_path / "lit"), chunk_bytes=4000)
    items: list[dict[str, Any]] = []
    for i in range(12):
        item: dict[str, Any] = {"grid": np.arange(6 * (i % 3 + 1), dtype=np.float32).reshape(i % 3 + 1, 6) + i,
                "t": torch.arange(4, dtype=torch.int16).reshape(2, 2) * i, "ok": i % 2 == 0}
        writer[i] = item
        items.append(item)
    writer.done()
    writer.merge()
    convert_to(tmp_path / "lit", tmp_path / "out", "litdata")
    table = arrow_rows(tmp_path / "out")
    for k, item in enumerate(items):
        grid = np.array(table.column("grid")[k].as_py(), np.float32).reshape(table.column("grid_shape")[k].as_py())
        assert np.array_equal(grid, item["grid"])
        t = np.array(table.column("t")[k].as_py(), np.int16).reshape(table.column("t_shape")[k].as_py())
        assert np.array_equal(t, item["t"].numpy())
    assert table.column("ok").to_pylist() == [it["ok"] for it in items]


def test_a_skipped_litdata_chunk_counts_every_item_it_held(tmp_path: Path) -> None:
    write_litdata(tmp_path / "lit", 25)
    chunks = sorted((tmp_path / "lit").glob("chunk-*.bin"))
    import json

    index = json.loads((tmp_path / "lit" / "index.json").read_text())
    sizes = {c["filename"]: c["chunk_size"] for c in index["chunks"]}
    chunks[0].write_bytes(b"\xff\xff\xff\xff" + chunks[0].read_bytes()[4:])  # its item count is damaged
    with pytest.raises(DatasetError, match=rf"{chunks[0].name}: holds 4294967295 items, index.json says"):
        convert_to(tmp_path / "lit", tmp_path / "out", "litdata")
    manifest = convert_to(tmp_path / "lit", tmp_path / "out2", "litdata", on_bad_record="skip")
    bad: Any = manifest.extra["bad_records"]
    assert bad["skipped"] == sizes[chunks[0].name] and manifest.rows == 25 - bad["skipped"]


def test_a_litdata_item_of_another_dtype_is_a_bad_record(tmp_path: Path) -> None:
    """A ``numpy`` leaf carries its dtype per item; the column takes the first item's, and an item
    of another dtype is a bad record (Arrow would cast 2.5 to 2 silently)."""
    writer = litdata_writer.BinaryWriter(str(tmp_path / "lit"), chunk_bytes=4000)
    for i in range(6):
        grid = np.full((2, 2), i, np.uint16) if i != 3 else np.full((2, 2), 2.5, np.float32)
        writer[i] = {"i": i, "grid": grid}
    writer.done()
    writer.merge()
    with pytest.raises(DatasetError, match=r"item 3: .*leaf 'grid' is float32, but the first item's .* is uint16"):
        convert_to(tmp_path / "lit", tmp_path / "out", "litdata")
    manifest = convert_to(tmp_path / "lit", tmp_path / "out2", "litdata", on_bad_record="skip")
    table = arrow_rows(tmp_path / "out2")
    assert manifest.rows == 5 and table.column("i").to_pylist() == [0, 1, 2, 4, 5]
    assert table.column("grid").to_pylist() == [[i] * 4 for i in (0, 1, 2, 4, 5)]


def test_a_truncated_compressed_mds_shard_is_named(tmp_path: Path) -> None:
    with mds_writer()(out=str(tmp_path / "mds"), columns={"x": "int", "raw": "bytes"}, compression="gz",
                      size_limit=1 << 12) as out:
        for i in range(60):
            out.write({"x": i, "raw": bytes([i]) * 200})
    shard = sorted((tmp_path / "mds").glob("shard.00001.mds.gz"))[0]
    shard.write_bytes(shard.read_bytes()[:-50])
    with pytest.raises(DatasetError, match=r"shard\.00001\.mds\.gz: does not read or decompress .*damaged"):
        convert_to(tmp_path / "mds", tmp_path / "out", "mds")
    manifest = convert_to(tmp_path / "mds", tmp_path / "out2", "mds", on_bad_record="skip")
    bad: Any = manifest.extra["bad_records"]
    assert bad["skipped"] > 0 and manifest.rows == 60 - bad["skipped"]


def test_mds_plain_ndarray_columns_take_the_first_samples_dtype(tmp_path: Path) -> None:
    """``ndarray`` without a dtype stores one per sample (the README promised ``list`` + ``_shape``;
    convert refused the column): the first sample's dtype is the column's, another is a bad record."""
    arrays = [np.arange(2 + i % 3, dtype=np.int32).reshape(1, -1) * (i + 1) for i in range(12)]
    arrays[7] = np.full((2, 2), 0.5, np.float64)
    with mds_writer()(out=str(tmp_path / "mds"), columns={"a": "ndarray", "i": "int"}, size_limit=1 << 10) as out:
        for i, array in enumerate(arrays):
            out.write({"a": array, "i": i})
    with pytest.raises(DatasetError, match=r"sample 7.*column 'a' is float64 here, but the first sample's .* is int32"):
        convert_to(tmp_path / "mds", tmp_path / "out", "mds")
    manifest = convert_to(tmp_path / "mds", tmp_path / "out2", "mds", on_bad_record="skip")
    table = arrow_rows(tmp_path / "out2")
    rows = [i for i in range(12) if i != 7]
    assert manifest.rows == 11 and table.column("i").to_pylist() == rows
    assert table.schema.field("a").type == pa.list_(pa.int32())
    assert table.column("a").to_pylist() == [arrays[i].ravel().tolist() for i in rows]
    assert table.column("a_shape").to_pylist() == [list(arrays[i].shape) for i in rows]


def test_litdata_list_and_dict_leaves_become_json_text(tmp_path: Path) -> None:
    """A Python list inside an item (token ids, boxes, tags) is a ``json`` leaf, stored in LitData's
    compact binary form: it converts to its JSON text (the column was refused)."""
    import json

    values: list[Any] = [
        [1, 2, 2**40], [], [0.5, -1.25], ["a", "é😀"], [True, False], [{"x": 1, "y": "s"}, {"x": None, "y": "t"}],
        [1, "mixed", None], [[1, 2], [3]], [1.5, 2],
    ]
    writer = litdata_writer.BinaryWriter(str(tmp_path / "lit"), chunk_bytes=1000)
    for i, value in enumerate(values):
        writer[i] = {"i": i, "meta": {"tags": value}}
    writer.done()
    writer.merge()
    index = json.loads((tmp_path / "lit" / "index.json").read_text())
    assert "json" in index["config"]["data_format"]
    manifest = convert_to(tmp_path / "lit", tmp_path / "out", "litdata")
    table = arrow_rows(tmp_path / "out")
    assert manifest.rows == len(values) and table.schema.field("meta.tags").type == pa.string()
    assert [json.loads(str(t)) for t in table.column("meta.tags").to_pylist()] == values


def test_litdata_bool_arrays_convert(tmp_path: Path) -> None:
    """numpy bool arrays (LitData dtype code 13) convert to list<bool> (an IndexError traceback for a
    1-d one, StopIteration for an n-d one, before)."""
    writer = litdata_writer.BinaryWriter(str(tmp_path / "lit"), chunk_bytes=1000)
    for i in range(4):
        writer[i] = {"flat": np.array([i % 2 == 0, True]), "grid": np.eye(2, dtype=bool) ^ (i == 3)}
    writer.done()
    writer.merge()
    convert_to(tmp_path / "lit", tmp_path / "out", "litdata")
    table = arrow_rows(tmp_path / "out")
    assert table.schema.field("flat").type == table.schema.field("grid").type == pa.list_(pa.bool_())
    assert table.column("flat").to_pylist() == [[i % 2 == 0, True] for i in range(4)]
    assert table.column("grid").to_pylist() == [(np.eye(2, dtype=bool) ^ (i == 3)).ravel().tolist() for i in range(4)]
    assert table.column("grid_shape").to_pylist() == [[2, 2]] * 4
