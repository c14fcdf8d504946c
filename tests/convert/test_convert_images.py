"""``flightfeed convert`` of image folders, checked at convert time: files that do not decode are
refused by path or skipped and counted (``--on-bad-image``), an empty class folder is an error,
and ``--max-side`` re-encodes only the images whose longer side exceeds it."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.storage import open_dataset
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.convert import cli as convert_cli
from flightfeed.wire.errors import ConfigError, DatasetError

ReadAll = Callable[[Dataset], pa.Table]


def jpeg(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def folder(root: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Two classes of three small JPEGs each, plus ``extra`` (relative path -> bytes)."""
    files = {f"{cls}/{i}.jpg": jpeg(20 + i, 16, seed=i + 10 * k) for k, cls in enumerate(("a", "b")) for i in range(3)}
    files.update(extra or {})
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def served(path: Path, read_dataset: ReadAll) -> pa.Table:
    ds = open_dataset("converted", str(path))
    try:
        return read_dataset(ds)
    finally:
        ds.close()


def settings(**kw: object) -> ConvertSettings:
    return ConvertSettings(progress=False, rows_per_batch=2, **kw)  # type: ignore[arg-type]


def bad_files() -> dict[str, bytes]:
    good = jpeg(30, 24, seed=99)
    return {"a/notes.jpg": b"this is a text file, not a JPEG\n", "b/cut.jpg": good[: len(good) // 2]}


@pytest.mark.parametrize("bad", ["a/notes.jpg", "b/cut.jpg"])
def test_a_file_that_does_not_decode_is_refused_by_path(tmp_path: Path, bad: str) -> None:
    folder(tmp_path / "src", {bad: bad_files()[bad]})
    with pytest.raises(DatasetError, match=rf"{bad}.*does not decode.*--on-bad-image skip"):
        convert(str(tmp_path / "src"), str(tmp_path / "out"), settings())
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skip_leaves_bad_files_out_and_counts_them(tmp_path: Path, read_dataset: ReadAll) -> None:
    files = folder(tmp_path / "src", bad_files())
    manifest = convert(str(tmp_path / "src"), str(tmp_path / "out"), settings(on_bad_image="skip"))
    assert manifest.rows == len(files) - 2
    skipped: dict[str, str] = manifest.extra["skipped_images"]
    assert sorted(Path(p).relative_to(tmp_path / "src").as_posix() for p in skipped) == ["a/notes.jpg", "b/cut.jpg"]
    table = served(tmp_path / "out", read_dataset)
    good = [files[k] for k in sorted(files) if k not in bad_files()]
    assert sorted(bytes(b or b"") for b in table.column("image").to_pylist()) == sorted(good)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["skipped_images"] == skipped


def test_decoded_conversion_checks_too(tmp_path: Path) -> None:
    folder(tmp_path / "src", bad_files())
    with pytest.raises(DatasetError, match=r"notes\.jpg"):
        convert(str(tmp_path / "src"), str(tmp_path / "out"), settings(decode=True, resize=(8, 8)))
    m = convert(str(tmp_path / "src"), str(tmp_path / "o2"), settings(decode=True, resize=(8, 8), on_bad_image="skip"))
    assert m.rows == 6


def test_an_empty_class_folder_is_an_error(tmp_path: Path) -> None:
    folder(tmp_path / "src")
    (tmp_path / "src" / "c_empty").mkdir()
    (tmp_path / "src" / "c_empty" / "readme.txt").write_text("no images here")
    with pytest.raises(DatasetError, match=r"class folder\(s\) without images: \['c_empty'\]"):
        convert(str(tmp_path / "src"), str(tmp_path / "out"), settings())


def test_max_side_reencodes_only_larger_images(tmp_path: Path, read_dataset: ReadAll) -> None:
    big, wide_png = jpeg(640, 480, seed=1), io.BytesIO()
    Image.fromarray(np.zeros((50, 300, 3), dtype=np.uint8)).save(wide_png, format="PNG")
    files = folder(tmp_path / "src", {"a/big.jpg": big, "b/wide.png": wide_png.getvalue()})
    manifest = convert(str(tmp_path / "src"), str(tmp_path / "out"), settings(max_side=256))
    assert manifest.extra["max_side"] == 256
    stored: list[bytes] = served(tmp_path / "out", read_dataset).column("image").to_pylist()  # type: ignore[assignment]
    by_size: dict[tuple[int, int], bytes] = {}
    for data in stored:
        with Image.open(io.BytesIO(data)) as img:
            by_size[img.size] = data
            fmt = img.format
        if img.size in ((256, 192), (256, 43)):
            assert fmt == ("JPEG" if img.size == (256, 192) else "PNG")
    assert (256, 192) in by_size and (256, 43) in by_size  # longer side now 256, aspect ratio kept
    small = {k: v for k, v in files.items() if k not in ("a/big.jpg", "b/wide.png")}
    assert set(small.values()) <= set(stored)  # untouched bytes
    assert len(by_size[(256, 192)]) < len(big)
    with pytest.raises(ConfigError, match="--max-side"):
        convert(str(tmp_path / "src"), str(tmp_path / "o2"), settings(max_side=256, decode=True, resize=(8, 8)))


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder(tmp_path / "src", bad_files())
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    args = parser.parse_args([str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress"])
    assert convert_cli.run(args) == 1
    assert "does not decode" in capsys.readouterr().err
    args = parser.parse_args(
        [str(tmp_path / "src"), str(tmp_path / "o2"), "--no-progress", "--on-bad-image", "skip", "--max-side", "24"]
    )
    assert convert_cli.run(args) == 0
    captured = capsys.readouterr()
    assert "wrote 6 rows" in captured.out
    assert "skipped 2 image(s) that do not decode" in captured.err and "notes.jpg" in captured.err
    with pytest.raises(SystemExit):
        parser.parse_args(["a", "b", "--on-bad-image", "ignore"])


def test_split_folders_are_refused_as_one_dataset_and_converted_each(tmp_path: Path, read_dataset: ReadAll) -> None:
    """ROOT/train and ROOT/val are splits, not two classes: convert() refuses naming them; the CLI
    converts each into DST/<split> with one class list; a class that happens to be called ``val``
    (images directly inside) stays a class."""
    root = tmp_path / "root"
    folder(root / "train")
    folder(root / "val", {"c/0.jpg": jpeg(8, 8, seed=5)})  # a class only val has
    with pytest.raises(ConfigError, match=r"holds dataset splits \(train/, val/\)"):
        convert(str(root), str(tmp_path / "one"), settings())
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    assert convert_cli.run(parser.parse_args([str(root), str(tmp_path / "out"), "--no-progress"])) == 0
    train, val = served(tmp_path / "out" / "train", read_dataset), served(tmp_path / "out" / "val", read_dataset)
    assert json.loads(train.schema.metadata[b"flightfeed.classes"]) == ["a", "b", "c"]
    assert train.column("label").to_pylist() == [0, 0, 0, 1, 1, 1]
    assert val.column("label").to_pylist() == [0, 0, 0, 1, 1, 1, 2]
    assert val.column("source_path").to_pylist()[-1] == "val/c/0.jpg"
    plain = tmp_path / "plain"
    folder(plain, {"val/0.jpg": jpeg(8, 8, seed=6)})  # classes a, b and val
    manifest = convert(str(plain), str(tmp_path / "p"), settings(source_path=False))
    assert json.loads(manifest.schema.metadata[b"flightfeed.classes"]) == ["a", "b", "val"]
    assert manifest.schema.names == ["image", "label"]  # --no-source-path
