"""`flightfeed serve --decode-workers N --config FILE` as an operator runs it: a preset from the
config file, served by worker processes too (any process can serve any ticket)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from flightfeed.client import FlightDataset, ReadOptions
from tests.support.processes import start_serve
from tests.transforms.conftest import CORRUPT, ROWS


def test_config_preset_served_by_worker_processes(image_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        "[transforms.presets]\n"
        'thumbs = [{name = "decode"}, {name = "resize", size = 24}, {name = "center_crop", size = 20},'
        ' {name = "to_chw"}]\n'
    )
    proc, location = start_serve(f"imgs={image_dir}", "--config", str(config), "--decode-workers", "2",
                                 "--workers", "2")
    try:
        ds = FlightDataset(
            location,
            "imgs",
            batch_size=8,
            transform="thumbs",
            rank=0,
            world_size=1,
            options=ReadOptions(streams=2, on_decode_error="skip", report_interval=None),
        )
        seen = []
        for batch in ds:
            assert tuple(batch["image"].shape[1:]) == (3, 20, 20)
            seen += batch["index"].tolist()
        assert sorted(seen) == sorted(set(range(ROWS)) - set(CORRUPT))
        assert ds.stats()["rows_skipped"] == len(CORRUPT)
        ds.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_bad_decode_workers_is_refused(image_dir: Path) -> None:
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"imgs={image_dir}", "--decode-workers", "0",
           "--port", "0", "--no-sidecar"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--decode-workers 0: must be >= 1" in result.stderr
