"""The share window releases what no stream can use any more (docs/operations.md, shared jobs): 64 trainers with
different seeds used to leave the window full (536 MB by default) with almost no reuse."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from prometheus_client import CollectorRegistry

from flightfeed.server.observe.shared import SharedMetrics
from flightfeed.server.request.shared_messages import ShareWindow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def message(i: int) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array(np.full(1024, i, dtype=np.uint8))], names=["x"])]


def trainer(window: ShareWindow, job: str, messages: int = 4) -> int:
    """One trainer's stream: reads its job's messages; returns how many it made itself."""
    made = [0]

    def maker(i: int) -> Callable[[], list[pa.RecordBatch]]:
        def make() -> list[pa.RecordBatch]:
            made[0] += 1
            return message(i)

        return make

    with window.reading("ds", (job, 0, messages)):
        for i in range(messages):
            window.get("ds", (job, i, i + 1), maker(i))
    return made[0]


def test_jobs_no_stream_reads_any_more_are_released_and_counted() -> None:
    clock, registry = Clock(), CollectorRegistry()
    metrics = SharedMetrics(registry)
    window = ShareWindow(1 << 30, metrics, clock=clock)
    for seed in range(64):  # 64 trainers, each its own seed: nothing to share
        assert trainer(window, f"seed-{seed}") == 4
        clock.now += 1.0
    clock.now += 10.0
    figures = window.describe()
    assert figures["bytes"] == 0 and figures["entries"] == 0
    assert figures["released"] == 64 * 4 and figures["released_bytes"] == 64 * 4 * 1024
    assert registry.get_sample_value("flightfeed_shared_released_total") == 64 * 4
    assert registry.get_sample_value("flightfeed_shared_window_bytes") == 0


def test_identical_jobs_one_after_another_still_share() -> None:
    clock = Clock()
    window = ShareWindow(1 << 30, clock=clock)
    assert trainer(window, "sweep") == 4
    clock.now += 5.0  # the next identical trainer starts within idle_s: every message is a hit
    assert trainer(window, "sweep") == 0
    with window.reading("ds", ("sweep", 0, 4)):  # a job being read is never released
        clock.now += 60.0
        assert window.describe()["entries"] == 4
    clock.now += 10.0
    assert window.describe()["entries"] == 0
    assert trainer(window, "sweep") == 4  # released: made again
