"""Token corpora as LLM teams have them -> a dataset with a ragged ``tokens`` column, one row per
document: nanoGPT ``train.bin`` (``--from nanogpt --eot ID``), Megatron-LM ``.bin`` + ``.idx``
(``--from megatron``; written by megatron-core's own builder where it installs, and byte-exact to
its layout by hand) and tokenized Parquet (served directly). Every token is compared, and the
client reads every document exactly once per epoch over 1, 3 and 8 ranks.
"""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.cli import main as flightfeed_main
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.convert.pipeline import SourceKind
from flightfeed.server.tools.convert.sources.tokens_megatron import MAGIC
from flightfeed.wire.errors import ConfigError, DatasetError

EOT = 50256
CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


def _documents(n: int = 300, seed: int = 0) -> list[np.ndarray]:
    """Documents of 0..60 token ids (some empty) below the end-of-text id."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, EOT, size=int(rng.integers(0, 61))).astype(np.uint16) for _ in range(n)]


def write_nanogpt(path: Path, docs: list[np.ndarray], tail: np.ndarray | None = None) -> np.ndarray:
    """As nanoGPT's prepare.py: each document's ids + the end-of-text id, into one uint16 memmap."""
    ids = np.concatenate([np.append(d, np.uint16(EOT)) for d in docs] + ([tail] if tail is not None else []))
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(ids),))
    arr[:] = ids
    arr.flush()
    del arr
    return ids


def write_mmidx(prefix: Path, docs: list[list[np.ndarray]], dtype: np.dtype[Any]) -> None:
    """Megatron's MMIDIDX layout byte for byte (documents of one or more sequences)."""
    seqs = [np.asarray(s, dtype) for d in docs for s in d]
    lengths = np.array([len(s) for s in seqs], np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))[:-1]]) * dtype.itemsize
    doc_idx = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    head = MAGIC + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype])
    head += struct.pack("<Q", len(seqs)) + struct.pack("<Q", len(doc_idx))
    body = lengths.tobytes() + pointers.astype(np.int64).tobytes() + doc_idx.tobytes()
    prefix.with_suffix(".idx").write_bytes(head + body)


def _read_docs(server: RunningServer, name: str, world: int, shuffle: bool, **read: Any) -> list[list[bytes]]:
    """Each rank's documents (as bytes), reading the epoch-1 order of ``name``."""
    out = []
    for rank in range(world):
        ds = FlightDataset(
            server.location, name, batch_size=16, shuffle=shuffle, seed=11, rank=rank, world_size=world,
            options=ReadOptions(streams=2, report_interval=None, **read),
        )
        ds.set_epoch(1)
        docs = []
        for b in ds:
            t = b["tokens"]
            if t.is_nested:
                docs += [t[r].numpy().tobytes() for r in range(t.shape[0])]
            else:
                n = b["tokens_lengths"].tolist()
                docs += [t[r, : n[r]].numpy().tobytes() for r in range(t.shape[0])]
        ds.close()
        out.append(docs)
    return out


def _check_exactly_once(server: RunningServer, name: str, expected: list[bytes], stream: bytes) -> None:
    """Stored order on one rank gives back the token stream; shuffled over 1, 3 and 8 ranks every
    document arrives exactly once (ranks disjoint, together the source's multiset)."""
    (stored,) = _read_docs(server, name, 1, shuffle=False)
    assert stored == expected
    assert b"".join(stored) == stream
    for world in (1, 3, 8):
        ranks = _read_docs(server, name, world, shuffle=True, ragged="padded" if world == 3 else "nested")
        got = [d for r in ranks for d in r]
        assert Counter(got) == Counter(expected), world
        assert len(got) == len(expected)
        if world > 1:
            assert max(map(len, ranks)) - min(map(len, ranks)) <= 16  # at most one batch apart
    (again,) = _read_docs(server, name, 1, shuffle=True)
    assert again != expected  # shuffled really is another order


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("tokens")
    docs = _documents()

    def quiet(kind: SourceKind, eot: int | None = None) -> ConvertSettings:
        return ConvertSettings(kind=kind, eot=eot, progress=False, rows_per_batch=37)

    # nanoGPT: documents end with EOT (a file cut inside its last one is refused: tests/convert/)
    ids = write_nanogpt(root / "train.bin", docs)
    convert(str(root / "train.bin"), str(root / "nano"), quiet("nanogpt", EOT))
    nano = [np.append(d, np.uint16(EOT)).tobytes() for d in docs]
    # Megatron, by hand (int32, some documents of several sentences) and, where it installs, by megatron-core
    mdocs = [[d.astype(np.int32)] if i % 5 else [d[:3], d[3:]] for i, d in enumerate(docs)]
    (root / "mega").mkdir()
    write_mmidx(root / "mega" / "corpus_text_document", mdocs, np.dtype(np.int32))
    convert(str(root / "mega" / "corpus_text_document"), str(root / "mega_out"), quiet("megatron"))
    mega = [np.concatenate(d).astype(np.int32).tobytes() for d in mdocs]
    # tokenized Parquet (list<int32>), served as it is
    (root / "pq").mkdir()
    column = pa.array([d.astype(np.int32) for d in docs], pa.list_(pa.int32()))
    pq.write_table(pa.table({"tokens": column}), root / "pq" / "part-0.parquet", row_group_size=64)
    parquet = [d.astype(np.int32).tobytes() for d in docs]
    served = {"nano": str(root / "nano"), "mega": str(root / "mega_out"), "pq": str(root / "pq")}
    with running_server(served) as srv:
        yield srv, {"root": root, "nano": (nano, ids.tobytes()), "mega": (mega, b"".join(mega)),
                    "pq": (parquet, b"".join(parquet))}


@pytest.mark.parametrize("name", ["nano", "mega", "pq"])
def test_every_token_exactly_once_over_1_3_8_ranks(corpora: tuple[RunningServer, dict[str, Any]], name: str) -> None:
    server, data = corpora
    expected, stream = data[name]
    _check_exactly_once(server, name, expected, stream)


_BUILD = """
import sys
import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

prefix = sys.argv[1]
flat, lengths = np.load(prefix + ".tokens.npy"), np.load(prefix + ".lengths.npy")
builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
for i, chunk in enumerate(np.split(flat, np.cumsum(lengths)[:-1])):
    d = torch.from_numpy(chunk.astype(np.int64))
    if i % 7 == 3:  # a document of two sentences
        builder.add_document(d, [len(d) // 2, len(d) - len(d) // 2])
    else:
        builder.add_item(d)
        builder.end_document()
builder.finalize(prefix + ".idx")
"""


def test_megatron_core_builder_output_converts_and_matches_the_layout(tmp_path: Path) -> None:
    """megatron-core's own IndexedDatasetBuilder writes the corpus (in a subprocess: importing
    megatron.core sets up much of its own), and the hand-written layout equals it byte for byte."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed (pip install --no-deps megatron-core)")
    docs = _documents(120, seed=3)
    np.save(tmp_path / "lib.tokens.npy", np.concatenate(docs))
    np.save(tmp_path / "lib.lengths.npy", np.array([len(d) for d in docs]))
    built = subprocess.run(
        [sys.executable, "-c", _BUILD, str(tmp_path / "lib")], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr[-3000:]
    parts = [[d[: len(d) // 2], d[len(d) // 2 :]] if i % 7 == 3 else [d] for i, d in enumerate(docs)]
    write_mmidx(tmp_path / "mine", parts, np.dtype(np.uint16))
    assert (tmp_path / "mine.idx").read_bytes() == (tmp_path / "lib.idx").read_bytes()
    assert (tmp_path / "mine.bin").read_bytes() == (tmp_path / "lib.bin").read_bytes()
    settings = ConvertSettings(kind="megatron", progress=False)
    manifest = convert(str(tmp_path / "lib.idx"), str(tmp_path / "out"), settings)
    assert manifest.rows == len(docs)
    with running_server({"lib": str(tmp_path / "out")}) as srv:
        (got,) = _read_docs(srv, "lib", 1, shuffle=False)
    assert got == [d.tobytes() for d in docs]


def test_cli_converts_nanogpt_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_nanogpt(tmp_path / "train.bin", _documents(40))
    args = ["convert", str(tmp_path / "train.bin"), str(tmp_path / "out"), "--from", "nanogpt", "--no-progress"]
    assert flightfeed_main(args) == 1
    assert "--eot ID" in capsys.readouterr().err
    assert flightfeed_main([*args, "--eot", str(EOT)]) == 0
    assert "wrote 40 rows" in capsys.readouterr().out
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(DatasetError, match="whole number of uint16"):
        convert(str(odd), str(tmp_path / "o2"), ConvertSettings(kind="nanogpt", eot=EOT, progress=False))
    with pytest.raises(ConfigError, match="does not fit"):
        convert(str(odd), str(tmp_path / "o3"), ConvertSettings(kind="nanogpt", eot=70000, progress=False))
    with pytest.raises(ConfigError, match="--eot applies only to --from nanogpt"):
        convert(str(tmp_path / "train.bin"), str(tmp_path / "o4"), ConvertSettings(kind="megatron", eot=1))
    with pytest.raises(ConfigError, match="--token-dtype applies only"):
        convert(str(tmp_path / "train.bin"), str(tmp_path / "o5"), ConvertSettings(kind="numpy", token_dtype="int32"))


def test_broken_megatron_pairs_fail_naming_the_file(tmp_path: Path) -> None:
    docs = [[d.astype(np.int32)] for d in _documents(30)]
    prefix = tmp_path / "c"

    def fails(match: str) -> None:
        with pytest.raises(DatasetError, match=match):
            convert(str(prefix), str(tmp_path / "out"), ConvertSettings(kind="megatron", progress=False))

    write_mmidx(prefix, docs, np.dtype(np.int32))
    data = prefix.with_suffix(".bin").read_bytes()
    prefix.with_suffix(".bin").write_bytes(data[:-4])
    fails(r"c\.bin: .* the pair is truncated")
    write_mmidx(prefix, docs, np.dtype(np.int32))
    index = prefix.with_suffix(".idx").read_bytes()
    prefix.with_suffix(".idx").write_bytes(index[:-8])
    fails(r"c\.idx: .* truncated or not MMIDIDX")
    prefix.with_suffix(".idx").write_bytes(b"NOTMMIDX!" + index[9:])
    fails("not a Megatron MMIDIDX index")
    prefix.with_suffix(".idx").write_bytes(index[:17] + struct.pack("<B", 7) + index[18:])
    fails("float32 values, not token ids")
    prefix.with_suffix(".bin").unlink()
    prefix.with_suffix(".idx").write_bytes(index)
    fails(r"c\.bin is missing")


@pytest.mark.parametrize("scan", [1, 2, 7, 1 << 24])
def test_document_bounds_do_not_depend_on_the_scan_chunk(monkeypatch: pytest.MonkeyPatch, scan: int) -> None:
    from flightfeed.server.tools.convert.sources import tokens_nanogpt

    monkeypatch.setattr(tokens_nanogpt, "_SCAN_TOKENS", scan)
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 13, 50):
        ids = rng.choice(np.array([1, 2, EOT], np.uint16), size=n, p=[0.4, 0.3, 0.3])
        naive = [0] + [i + 1 for i in range(n) if ids[i] == EOT]
        if naive[-1] != n:
            naive.append(n)
        assert tokens_nanogpt.document_bounds(ids, EOT).tolist() == naive, (scan, ids.tolist())


def test_a_folder_of_nanogpt_splits_is_refused(tmp_path: Path) -> None:
    """nanoGPT's prepare.py writes train.bin and val.bin side by side: converting the folder made
    one dataset of both (the validation tokens trained on); each split converts on its own."""
    write_nanogpt(tmp_path / "train.bin", _documents(20))
    write_nanogpt(tmp_path / "val.bin", _documents(5, seed=9))
    says = r"several splits \(train: 1 file\(s\), val: 1 file\(s\)\).*convert .*train\.bin DST/train"
    with pytest.raises(ConfigError, match=says):
        convert(str(tmp_path), str(tmp_path / "out"), ConvertSettings(kind="nanogpt", eot=EOT, progress=False))
    settings = ConvertSettings(kind="nanogpt", eot=EOT, progress=False)
    assert convert(str(tmp_path / "val.bin"), str(tmp_path / "val"), settings).rows == 5


def test_a_nanogpt_file_without_one_end_of_text_token_is_refused(tmp_path: Path) -> None:
    """A wrong --eot converted a whole corpus as one document (a warning only): it is refused."""
    settings = ConvertSettings(kind="nanogpt", eot=65534, progress=False)
    (tmp_path / "train.bin").write_bytes(np.full(1 << 20, 7, np.uint16).tobytes())
    with pytest.raises(DatasetError, match=r"does not end with the end-of-text id --eot 65534 \(its last token is 7\)"):
        convert(str(tmp_path / "train.bin"), str(tmp_path / "out"), settings)
