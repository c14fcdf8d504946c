"""``flightfeed serve`` refuses at start, in one line naming the setting, a grace period that is no
finite number of seconds up to a week (``--grace inf`` crashed at SIGTERM with OverflowError, as
did ``1e10``; ``nan`` and a JSON ``1e400`` were taken) and a ``datasets`` setting of the config
file that is not a table (a path or a list was an AttributeError traceback)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from flightfeed.server.cli import main as cli_main
from flightfeed.server.serve.args import add_arguments
from flightfeed.server.serve.config_file import merge_config
from flightfeed.wire.errors import ConfigError


def serve_fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["serve", *argv, "--port", "0", "--no-sidecar", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e400", "1e10", "-1"])  # 1e10 s overflowed time_t too
def test_a_grace_flag_that_is_no_finite_number_is_refused(
    small_dir: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = serve_fails([f"small={small_dir}", f"--grace={value}"], capsys)
    assert "flightfeed serve: error: --grace " in err, err
    assert "must be a finite number of seconds from 0 to 604800" in err, err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"grace": 1e400}', "grace = inf: expected a finite number (a number past 1.8e308, e.g. 1e400, reads as inf)"),
        ('{"grace": NaN}', "grace = nan: expected a finite number"),
        ('{"grace": -Infinity}', "grace = -inf: expected a finite number"),
    ],
)
def test_a_grace_of_the_json_file_that_is_no_finite_number_is_refused(
    small_dir: Path, tmp_path: Path, text: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "serve.json").write_text(text)
    err = serve_fails([f"small={small_dir}", "--config", str(tmp_path / "serve.json")], capsys)
    assert f"serve.json: {said}" in err, err


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_grace_of_the_toml_file_that_is_no_finite_number_is_refused(value: str, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    with pytest.raises(ConfigError, match=rf"--config serve\.toml: grace = {value}: expected a finite number"):
        merge_config(args, {"grace": float(value)}, "serve.toml", parser)


@pytest.mark.parametrize(
    ("datasets", "shown"),
    [
        ('"/data/train"', "datasets = '/data/train'"),
        ('["/data/train", "/data/val"]', "datasets = ['/data/train', '/data/val']"),
        ("{train = 3}", "datasets.train = 3"),
    ],
)
def test_datasets_in_the_file_that_are_no_table_are_one_line(
    tmp_path: Path, datasets: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "serve.toml").write_text(f"datasets = {datasets}\n")
    err = serve_fails(["--config", str(tmp_path / "serve.toml")], capsys)
    assert f"serve.toml: {shown}: expected a table of NAME = \"URI\"" in err, err


def test_a_table_of_datasets_and_a_finite_grace_still_serve_their_settings(small_dir: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    config = json.loads(json.dumps({"grace": 2.5, "datasets": {"small": str(small_dir)}}))
    merge_config(args, config, "serve.json", parser)
    assert args.grace == 2.5


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sidecar", "--flight", "grpc://127.0.0.1:1", "--port", "0", "--timeout", "inf"],
         "flightfeed sidecar: error: --timeout inf: must be a finite number of seconds > 0"),
        (["bench", "grpc://127.0.0.1:1", "d", "--step-ms", "nan"],
         "flightfeed bench: error: --step-ms nan: must be a finite number of milliseconds >= 0"),
    ],
)
def test_the_other_float_flags_refuse_numbers_that_are_not_finite(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
