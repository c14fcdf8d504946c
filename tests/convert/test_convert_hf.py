"""Hugging Face ``datasets`` folders (``save_to_disk``): plain columns served directly; Image(),
ClassLabel and Sequence features converted with ``--from hf`` into columns the client takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import DatasetError
from tests.convert.format_roundtrip import (
    arrow_rows,
    convert_to,
    import_hf_datasets,
    jpeg,
    served_rows,
)

hf = import_hf_datasets()


def save(path: Path, n: int = 30) -> dict[str, list[object]]:
    ClassLabel, Dataset, Features, Image, Sequence, Value = (
        hf.ClassLabel,
        hf.Dataset,
        hf.Features,
        hf.Image,
        hf.Sequence,
        hf.Value,
    )

    features = Features(
        {
            "img": Image(),
            "label": ClassLabel(names=["cat", "dog", "emu"]),
            "tokens": Sequence(Value("int32")),
            "score": Value("float32"),
            "text": Value("string"),
        }
    )
    data: dict[str, list[object]] = {
        "img": [{"bytes": jpeg(i), "path": f"img/{i}.jpg" if i % 2 else None} for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "tokens": [list(range(i % 4)) for i in range(n)],
        "score": [i / 4 for i in range(n)],
        "text": [f"row {i}" for i in range(n)],
    }
    Dataset.from_dict(data, features=features).save_to_disk(str(path), num_shards=2)
    return data


def test_plain_columns_of_a_save_to_disk_folder_are_served_directly(tmp_path: Path) -> None:
    data = save(tmp_path / "hf")
    got = served_rows(tmp_path / "hf", ["label", "score", "text"])
    assert got == {"label": data["label"], "score": data["score"], "text": data["text"]}
    from flightfeed.client import FlightDataset, ReadOptions

    with running_server({"d": str(tmp_path / "hf")}) as server:  # ClassLabel names from the HF metadata
        ds = FlightDataset(server.location, "d", columns=["label"], options=ReadOptions(report_interval=None))
        assert ds.classes == ["cat", "dog", "emu"]


def test_hf_features_convert_to_client_columns(tmp_path: Path) -> None:
    from flightfeed.client import FlightDataset, ReadOptions

    data = save(tmp_path / "hf")
    manifest = convert_to(tmp_path / "hf", tmp_path / "out", "auto")
    assert manifest.rows == 30
    types = {f.name: str(f.type) for f in manifest.schema}
    assert types == {
        "img": "binary",
        "img_path": "string",
        "label": "int64",
        "tokens": "list<item: int32>",
        "score": "float",
        "text": "string",
    }
    got = served_rows(tmp_path / "out", ["img", "img_path", "label", "score", "text"])
    stored = hf.load_from_disk(str(tmp_path / "hf")).cast_column("img", hf.Image(decode=False))["img"]
    assert got["img"] == [d["bytes"] for d in data["img"]] == [d["bytes"] for d in stored]  # type: ignore[index]
    assert got["img_path"] == [d["path"] for d in stored]  # datasets keeps the file's base name
    assert got["label"] == data["label"] and got["score"] == data["score"] and got["text"] == data["text"]
    assert arrow_rows(tmp_path / "out").column("tokens").to_pylist() == data["tokens"]
    meta = manifest.schema.metadata
    assert json.loads(meta[b"flightfeed.class_names"]) == {"label": ["cat", "dog", "emu"]}
    with running_server({"d": str(tmp_path / "out")}) as server:
        ds = FlightDataset(server.location, "d", columns=["label"], options=ReadOptions(report_interval=None))
        assert ds.classes == ["cat", "dog", "emu"]


def test_an_image_without_bytes_is_a_named_bad_record(tmp_path: Path) -> None:
    Dataset, Features, Image, Value = hf.Dataset, hf.Features, hf.Image, hf.Value

    (tmp_path / "elsewhere.jpg").write_bytes(jpeg(1))
    features = Features({"img": Image(), "n": Value("int64")})
    rows = {"img": [{"bytes": jpeg(0), "path": None}, str(tmp_path / "elsewhere.jpg")], "n": [0, 1]}
    Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "hf"))
    data = tmp_path / "hf" / "data-00000-of-00001.arrow"  # save_to_disk embeds the file: drop its bytes again
    table = pa.ipc.open_stream(pa.memory_map(str(data))).read_all()
    img = cast(pa.StructArray, table.column("img").combine_chunks())
    without = pa.StructArray.from_arrays(
        [pa.array([img.field("bytes")[0].as_py(), None], pa.binary()), pa.array([None, "elsewhere.jpg"])],
        fields=list(img.type),
    )
    table = table.set_column(0, table.schema.field("img"), without)
    with pa.ipc.new_stream(str(data), table.schema) as out:
        out.write_table(table)
    from flightfeed.wire.errors import DatasetError

    with pytest.raises(DatasetError, match=r"data-00000-of-00001\.arrow: row 1: 'img' has no bytes"):
        convert_to(tmp_path / "hf", tmp_path / "out", "hf")
    manifest = convert_to(tmp_path / "hf", tmp_path / "out2", "hf", on_bad_record="skip")
    assert manifest.rows == 1 and manifest.extra["bad_records"]["skipped"] == 1


def test_an_audio_feature_becomes_bytes_and_path(tmp_path: Path) -> None:
    import io
    import wave

    clips = []
    for i in range(5):
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes(bytes([i, 1]) * (50 + i))
        clips.append(buf.getvalue())
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"audio": pa.array([{"bytes": c, "path": f"{i}.wav"} for i, c in enumerate(clips)], struct),
                      "n": list(range(5))})
    # the table as datasets stores Audio() (encoding it through datasets needs torchcodec, not installed here)
    features = hf.Features({"audio": hf.Audio(), "n": hf.Value("int64")})
    hf.Dataset(table, info=hf.DatasetInfo(features=features)).save_to_disk(str(tmp_path / "hf"))
    manifest = convert_to(tmp_path / "hf", tmp_path / "out", "auto")
    assert [f.name for f in manifest.schema] == ["audio", "audio_path", "n"]
    got = served_rows(tmp_path / "out")
    assert got["audio"] == clips and got["audio_path"] == [f"{i}.wav" for i in range(5)] and got["n"] == [0, 1, 2, 3, 4]


def test_a_damaged_arrow_file_is_named(tmp_path: Path) -> None:
    from flightfeed.wire.errors import DatasetError

    save(tmp_path / "hf", n=30)
    data = tmp_path / "hf" / "data-00001-of-00002.arrow"
    data.write_bytes(data.read_bytes()[:-200])
    with pytest.raises(DatasetError, match=r"data-00001-of-00002\.arrow: not a readable Arrow stream file"):
        convert_to(tmp_path / "hf", tmp_path / "out", "hf")


def test_map_cache_files_in_a_save_to_disk_folder_are_not_served(tmp_path: Path) -> None:
    """``load_from_disk(folder).map(...)`` writes its result as ``cache-*.arrow`` into the folder:
    served directly, the folder is the data files its ``state.json`` lists, nothing else."""
    hf.Dataset.from_dict({"x": list(range(40))}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    hf.load_from_disk(str(tmp_path / "hf")).map(lambda row: {"x": row["x"] + 1000})
    assert list((tmp_path / "hf").glob("cache-*.arrow"))
    assert served_rows(tmp_path / "hf", ["x"]) == {"x": list(range(40))}


def test_fixed_shape_array_features_convert_to_tensor_columns(tmp_path: Path) -> None:
    """``Array2D``/``Array3D`` are stored as nested lists, which the client cannot take (two ragged
    dimensions): converted, they are fixed-shape tensor columns; a null row is a named bad record."""
    import numpy as np

    grids = [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(9)]
    cubes = [np.full((2, 2, 3), i, np.uint8) for i in range(9)]
    features = hf.Features({"grid": hf.Array2D((2, 3), "float32"), "cube": hf.Array3D((2, 2, 3), "uint8"),
                            "i": hf.Value("int64")})
    data = {"grid": grids, "cube": [c if i != 4 else None for i, c in enumerate(cubes)], "i": list(range(9))}
    hf.Dataset.from_dict(data, features=features).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    with pytest.raises(DatasetError, match=r"data-00000-of-00002\.arrow: row 4: 'cube' is null or not of its shape"):
        convert_to(tmp_path / "hf", tmp_path / "out", "hf")
    manifest = convert_to(tmp_path / "hf", tmp_path / "out2", "hf", on_bad_record="skip")
    assert manifest.rows == 8 and manifest.extra["bad_records"]["skipped"] == 1
    from flightfeed.client import FlightDataset, ReadOptions

    with running_server({"d": str(tmp_path / "out2")}) as server:
        ds = FlightDataset(server.location, "d", batch_size=3, shuffle=False, options=ReadOptions(report_interval=None))
        got = {k: np.concatenate([b[k].numpy() for b in ds]) for k in ("grid", "cube", "i")}
    rows = [i for i in range(9) if i != 4]
    assert got["grid"].shape == (8, 2, 3) and got["cube"].shape == (8, 2, 2, 3) and got["i"].tolist() == rows
    np.testing.assert_array_equal(got["grid"], np.stack([grids[i] for i in rows]))
    np.testing.assert_array_equal(got["cube"], np.stack([cubes[i] for i in rows]))


def test_a_dataset_dict_folder_is_not_served_as_one_dataset(tmp_path: Path) -> None:
    """``DatasetDict.save_to_disk`` writes a folder per split: serving the folder mixed the splits."""
    from flightfeed.server.storage.resolve import open_dataset

    splits = hf.DatasetDict({s: hf.Dataset.from_dict({"x": list(range(n))}) for s, n in (("train", 6), ("test", 2))})
    splits.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DatasetError, match=r"DatasetDict \(train, test\).*serve each split, e.g\. NAME=.*dd/train"):
        open_dataset("d", str(tmp_path / "dd"))
    ds = open_dataset("d", str(tmp_path / "dd" / "train"))
    try:
        assert ds.num_rows == 6
    finally:
        ds.close()


def test_on_s3_a_save_to_disk_prefix_is_its_listed_files(s3: LocalS3, tmp_path: Path) -> None:
    from flightfeed.server.storage.resolve import open_dataset

    hf.Dataset.from_dict({"x": list(range(30))}).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    hf.load_from_disk(str(tmp_path / "hf")).map(lambda row: {"x": row["x"] + 1000})  # cache-*.arrow
    assert list((tmp_path / "hf").glob("cache-*.arrow"))
    splits = hf.DatasetDict({s: hf.Dataset.from_dict({"x": [1, 2]}) for s in ("train", "test")})
    splits.save_to_disk(str(tmp_path / "dd"))
    bucket = s3.new_bucket()
    s3.upload_dir(tmp_path / "hf", f"s3://{bucket}/hf")
    s3.upload_dir(tmp_path / "dd", f"s3://{bucket}/dd")
    ds = open_dataset("d", f"s3://{bucket}/hf", s3.options(tmp_path / "cache"))
    try:
        assert ds.num_rows == 30
    finally:
        ds.close()
    with pytest.raises(DatasetError, match=r"DatasetDict \(train, test\).*NAME=s3://.*/dd/train"):
        open_dataset("d", f"s3://{bucket}/dd", s3.options(tmp_path / "cache"))
