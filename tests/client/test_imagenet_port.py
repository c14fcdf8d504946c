"""The README's port of pytorch/examples' ``imagenet/main.py`` (``tests/client/imagenet_port.py``) run as
a user runs it, on a folder of real JPEGs with ``train/`` and ``val/`` split folders:

``flightfeed convert ROOT DST`` makes one dataset per split (never a 2-class dataset named after the
splits), both are served with the ImageNet presets, and the script reads them with ``-j 0``, with
``-j 2`` (DataLoader's default ``fork`` workers, ``len(train_loader)`` asked in the parent first) and
with StatefulDataLoader; a preempted run resumed from its checkpoint delivers exactly the batches
(stored rows, in order) of an uninterrupted run, tail batch included."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from flightfeed.server.storage import open_dataset
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.tools.convert import cli as convert_cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "client" / "imagenet_port.py"
CLASSES = ("cat", "dog", "owl")
TRAIN_PER_CLASS, VAL_PER_CLASS, BATCH = 7, 3, 4  # 21 train rows: 6 batches, the last one of 1 row


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (48 + seed % 5, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("imagenet")
    src = tmp / "imagenet"
    for split, per in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for k, cls in enumerate(CLASSES):
            folder = src / split / cls
            folder.mkdir(parents=True)
            for i in range(per):
                (folder / f"{cls}_{i}.jpg").write_bytes(_jpeg(100 * k + i + (0 if split == "train" else 50)))
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    assert convert_cli.run(parser.parse_args([str(src), str(tmp / "ff"), "--no-progress"])) == 0
    with running_server({"train": str(tmp / "ff" / "train"), "val": str(tmp / "ff" / "val")}) as srv:
        yield srv, tmp


def test_convert_makes_one_dataset_per_split_with_shared_labels(served: tuple[RunningServer, Path]) -> None:
    _, tmp = served
    for split, per in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        ds = open_dataset(split, str(tmp / "ff" / split))
        try:
            table = pa.Table.from_batches([ds.chunk(c) for c in range(ds.num_chunks)], schema=ds.schema)
        finally:
            ds.close()
        assert table.num_rows == per * len(CLASSES)
        assert ds.schema.metadata[b"flightfeed.classes"] == json.dumps(list(CLASSES)).encode()
        paths = table.column("source_path").to_pylist()  # relative to ROOT: traceable to the file
        labels: list[int] = table.column("label").to_pylist()  # type: ignore[assignment]
        assert paths[0] == f"{split}/cat/cat_0.jpg"
        assert all(str(p).split("/")[1] == CLASSES[label] for p, label in zip(paths, labels, strict=True))


def _runs(location: str, tmp: Path, runs: dict[str, list[str]]) -> dict[str, list[dict[str, Any]]]:
    """Run the script once per entry (``name -> flags``), all at once; each run's batches, traced."""
    started = {}
    for name, flags in runs.items():
        cmd = [sys.executable, str(SCRIPT), location, "-b", str(BATCH), "--epochs", "2", "--seed", "5",
               "--trace", str(tmp / f"{name}.jsonl"), "--checkpoint", str(tmp / f"{name.split('+')[0]}.pth"), *flags]
        started[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    out = {}
    for name, proc in started.items():
        stdout, stderr = proc.communicate(timeout=400)
        assert proc.returncode == 0, f"{name}:\n{stdout[-2000:]}\n{stderr[-4000:]}"
        assert "forked from process" not in stderr
        out[name] = [json.loads(line) for line in (tmp / f"{name}.jsonl").read_text().splitlines()]
        # no warning about checkpoints the port never takes: with -j N it checkpoints at epochs' ends
        # (the model) or through StatefulDataLoader, never a dataset read by a plain DataLoader's workers
        assert "read by the workers of a plain DataLoader" not in stderr, (name, stderr[-3000:])
        assert stderr.count("DataLoader workers add no speed") == (0 if "-j 0" in " ".join(runs[name]) else 1)
    return out


def test_the_port_resumes_exactly_with_and_without_workers(served: tuple[RunningServer, Path]) -> None:
    srv, tmp = served
    first = _runs(srv.location, tmp, {
        "j0": ["-j", "0", "--stop-after", "2"],  # preempted after 2 batches of epoch 0 (ds.state_dict())
        "j2": ["-j", "2"],  # DataLoader's default (fork) workers; len(train_loader) asked in the parent first
        "sdl": ["-j", "2", "--stateful", "--stop-after", "3"],  # StatefulDataLoader (loader.state_dict())
    })
    assert [t["batch"] for t in first["j0"]] == [0, 1] and [t["batch"] for t in first["sdl"]] == [0, 1, 2]
    resumed = _runs(srv.location, tmp, {
        "j0+resume": ["-j", "0", "--resume", str(tmp / "j0.pth")],
        "sdl+resume": ["-j", "2", "--stateful", "--resume", str(tmp / "sdl.pth")],
    })
    forked = first["j2"]
    assert first["j0"] + resumed["j0+resume"] == forked
    assert first["sdl"] + resumed["sdl+resume"] == forked
    rows = TRAIN_PER_CLASS * len(CLASSES)
    epochs = []
    for epoch in (0, 1):
        train = [t for t in forked if t["phase"] == "train" and t["epoch"] == epoch]
        order = [r for t in train for r in t["rows"]]
        assert sorted(order) == list(range(rows)) and order != list(range(rows))  # every row once, shuffled
        assert [len(t["rows"]) for t in train] == [4, 4, 4, 4, 4, 1]  # the tail batch is kept
        assert [t["batch"] for t in train] == list(range(6))
        val = [r for t in forked if t["phase"] == "val" and t["epoch"] == epoch for r in t["rows"]]
        assert val == list(range(VAL_PER_CLASS * len(CLASSES)))
        epochs.append(order)
    assert epochs[0] != epochs[1]  # set_epoch reached the workers


def test_dummy_is_refused_saying_why(served: tuple[RunningServer, Path]) -> None:
    srv, _ = served
    done = subprocess.run([sys.executable, str(SCRIPT), srv.location, "--dummy"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "--dummy cannot work with flightfeed" in done.stderr
