"""``./run bench --report`` (``bench/report.py``) draws docs/performance.md's plots from the benchmarks' JSON:
one PNG per readable JSON with figures to plot, the machine and load in each title, others named and skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report import machine_line, main, report

SCALING = {
    "machine": {"cpu": "Test CPU", "nproc": 2},
    "load_before": [1.5, 1.0, 0.5],
    "summary": {
        "speedup_2_threads_stored_send": 1.9,
        "gil_free_share_stored_send": 0.93,
        "speedup_2_threads_shuffled_gather": 1.4,
        "gil_free_share_shuffled_gather": 0.75,
    },
    "targets": {"speedup_2_threads": 1.8},
}
THROUGHPUT = {
    "machine": {"cpu": "Test CPU", "nproc": 2},
    "load_average": [3.0, 2.0, 1.0],
    "ratios": {"flightfeed_vs_raw": 0.93, "flightfeed_vs_seed": float("nan")},
    "targets": {"flightfeed_vs_raw": 0.9, "flightfeed_vs_seed": 5.0},
}


def test_report_draws_one_png_per_json_with_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "out"
    src.mkdir()
    (src / "scaling.json").write_text(json.dumps(SCALING))
    (src / "throughput.json").write_text(json.dumps(THROUGHPUT))
    (src / "catalog.json").write_text(json.dumps({"rows": 10}))  # nothing with targets
    (src / "broken.json").write_text("{not json")
    made = report(src, tmp_path / "img")
    assert sorted(p.name for p in made) == ["scaling_speedup.png", "throughput_ratios.png"]
    for path in made:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    said = capsys.readouterr().out
    assert "broken.json: not JSON" in said
    assert "catalog.json: no ratios with targets to plot; skipped" in said


def test_titles_name_machine_and_load() -> None:
    assert machine_line(SCALING) == "Test CPU, 2 cores, 1-min load 1.5"
    assert machine_line(THROUGHPUT) == "Test CPU, 2 cores, 1-min load 3.0"
    assert machine_line({}) == "unknown CPU, ? cores, 1-min load not recorded"


def test_no_json_is_a_failure_that_says_what_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--source", str(tmp_path), "--dest", str(tmp_path / "img")]) == 1
    assert "run the benchmarks first" in capsys.readouterr().out
