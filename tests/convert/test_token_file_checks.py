"""``convert --from nanogpt``: a token file whose ``--eot`` / ``--token-dtype`` do not fit it is
refused naming the flag (a uint32 file read as uint16, a wrong ``--eot``, a file cut inside its last
document all converted silently to wrong documents)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flightfeed.server.cli import main as flightfeed_main
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.wire.errors import DatasetError

EOT = 50256


def nanogpt(path: Path, tokens: list[int] | np.ndarray, dtype: str = "uint16") -> Path:
    np.asarray(tokens, dtype).tofile(path)
    return path


def refused(src: Path, eot: int, dtype: str | None = None) -> str:
    with pytest.raises(DatasetError) as info:
        convert(str(src), str(src.parent / "out"), ConvertSettings(kind="nanogpt", eot=eot, token_dtype=dtype,
                                                                    progress=False))
    assert not (src.parent / "out" / "manifest.json").exists()
    return str(info.value)


def corpus(docs: int, seed: int = 0, vocab: int = EOT) -> np.ndarray:
    """``docs`` documents of 1..400 ids below ``vocab``, each followed by EOT."""
    rng = np.random.default_rng(seed)
    parts = [np.append(rng.integers(0, vocab, size=int(rng.integers(1, 401))), EOT) for _ in range(docs)]
    return np.concatenate(parts)


def test_the_issue_repro_a_uint32_file_read_as_uint16_is_refused_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nanogpt(tmp_path / "train.bin", [70000, 5, 2, 131000, 7, 2], "uint32")
    args = ["convert", str(tmp_path / "train.bin"), str(tmp_path / "out"), "--from", "nanogpt", "--eot", "2",
            "--no-progress"]
    assert flightfeed_main(args) != 0  # was: 0, rows [[4464,1,5,0,2],[0,65464,1,7,0,2],[0]]
    err = capsys.readouterr().err
    assert "train.bin: does not end with the end-of-text id --eot 2 (its last token is 0)" in err
    assert "--token-dtype uint16" in err and "Traceback" not in err
    assert flightfeed_main([*args, "--token-dtype", "uint32"]) == 0  # the dtype it was written in
    assert "wrote 2 rows" in capsys.readouterr().out


def test_a_large_uint32_file_read_as_uint16_names_the_wider_dtype(tmp_path: Path) -> None:
    ids = corpus(300)  # GPT-2 ids, written as uint32 (tiktoken's cl100k files are): its last uint16 is 0
    path = nanogpt(tmp_path / "train.bin", ids, "uint32")
    assert "read as --token-dtype uint16, every other token is 0-3" in refused(path, EOT)
    assert "pass --token-dtype uint32" in refused(path, EOT)
    assert "pass --token-dtype uint32" in refused(path, 0)  # even an --eot that the high halves match
    done = convert(str(path), str(tmp_path / "ok"), ConvertSettings(kind="nanogpt", eot=EOT, token_dtype="uint32",
                                                                    progress=False))
    assert done.rows == 300


@pytest.mark.parametrize("eot", [13, 50257])
def test_the_issue_repro_a_wrong_eot_is_refused(tmp_path: Path, eot: int) -> None:
    path = nanogpt(tmp_path / "train.bin", [11, 12, 50256, 13, 14, 15, 50256])
    text = refused(path, eot)
    assert f"does not end with the end-of-text id --eot {eot} (its last token is 50256)" in text
    assert "--token-dtype uint16" in text and "\n" not in text


def test_the_issue_repro_a_file_cut_inside_its_last_document_is_refused(tmp_path: Path) -> None:
    path = nanogpt(tmp_path / "train.bin", [11, 12, 50256, 13, 14])  # was: [[11,12,50256],[13,14]]
    assert "does not end with the end-of-text id --eot 50256 (its last token is 14): the file is cut" in refused(
        path, EOT
    )
    big = corpus(2000)
    path = nanogpt(tmp_path / "train.bin", big[: len(big) - 7])  # whatever its size
    assert "does not end with the end-of-text id --eot 50256" in refused(path, EOT)


def test_an_id_that_ends_documents_at_no_plausible_rate_is_refused(tmp_path: Path) -> None:
    ids = corpus(1000)
    ids[::3] = 13  # a frequent id given as --eot: ends documents every 3 tokens (and the file with it)
    ids[-1] = 13
    text = refused(nanogpt(tmp_path / "train.bin", ids), 13)
    assert "--eot 13 ends" in text and "tokens each, under 4): not an end-of-text id's rate" in text
    rare = np.full((1 << 22) + 10, 7, np.uint16)
    rare[-1] = 9  # 4 M tokens, one document: an id the tokenizer never wrote after each document
    assert "tokens each, over 4,194,304)" in refused(nanogpt(tmp_path / "train.bin", rare), 9)


def test_good_files_still_convert_exactly(tmp_path: Path) -> None:
    ids = corpus(500, seed=3)
    nanogpt(tmp_path / "a.bin", ids)
    manifest = convert(str(tmp_path / "a.bin"), str(tmp_path / "out"), ConvertSettings(kind="nanogpt", eot=EOT,
                                                                                          progress=False))
    assert manifest.rows == 500
    small = nanogpt(tmp_path / "s.bin", [1, 2, 3, EOT, 4, 5, 6, 7, EOT])  # tiny files: the end and rate checks
    assert convert(str(small), str(tmp_path / "o2"), ConvertSettings(kind="nanogpt", eot=EOT, progress=False)).rows == 2


@pytest.mark.parametrize(("magic", "dtype"), [(20240520, "uint16"), (20240801, "uint32")])
def test_an_llmc_shard_is_named_not_read_as_tokens(tmp_path: Path, magic: int, dtype: str) -> None:
    """llm.c / modded-nanogpt shards: a 256-int32 header, then the id *before* each document (their
    header was read as tokens)."""
    header = np.zeros(256, np.int32)
    header[:3] = [magic, 1, 4000]
    body = np.concatenate([np.append(EOT, np.arange(1, 400) % 5000) for _ in range(10)]).astype(dtype)
    path = tmp_path / "fineweb_train_000001.bin"
    path.write_bytes(header.tobytes() + body.tobytes())
    text = refused(path, EOT, dtype)
    assert f"starts with the 1024-byte header of an llm.c / modded-nanogpt token shard (magic {magic})" in text
