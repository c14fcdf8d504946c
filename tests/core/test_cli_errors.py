"""A wrong flag on the command line is one line naming the subcommand, the flag it is close to and
where every flag is listed (docs/cli.md), not the whole usage block under the top-level ``flightfeed``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flightfeed.server.cli import main as cli_main


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and err.count("\n") == 1, err
    return err.strip()


def test_a_misspelt_flag_names_the_subcommand_and_the_flag_meant(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["serve", "train=/data/train", "--prot", "9000"], capsys)
    assert err.startswith("flightfeed serve: error: unrecognized arguments: --prot 9000; did you mean --port?"), err
    assert "`flightfeed serve --help` lists every flag" in err
    err = _error(["convert", "a", "b", "--form", "images", "--hdf5-grup=/x"], capsys)
    assert "flightfeed convert: error:" in err and "--from (for --form), --hdf5-group (for --hdf5-grup)" in err


def test_a_flag_close_to_none_is_named_without_a_guess(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["serve", "train=/data/train", "--zzz"], capsys)
    assert err == "flightfeed serve: error: unrecognized arguments: --zzz (`flightfeed serve --help` lists every flag)"


def test_a_bad_value_and_a_bad_command_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["serve", "train=/data/train", "--cache-size", "5XB"], capsys)
    assert err.startswith("flightfeed serve: error: argument --cache-size: '5XB' is not a size"), err
    err = _error(["servee", "train=/data/train"], capsys)
    assert err.startswith("flightfeed: error: argument COMMAND: invalid choice: 'servee'")
    assert "`flightfeed --help` lists the commands" in err


def test_output_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    """``flightfeed inspect DIR | head``: the reader closed the pipe before the output was written."""
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "x.parquet")
    read, write = os.pipe()
    os.close(read)  # every write fails with EPIPE, as after `head` has exited
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flightfeed.server", "inspect", str(tmp_path / "x.parquet")],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141
