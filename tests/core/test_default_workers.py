"""The default `flightfeed serve` uses the cores it is given: one serving process per 2 cores."""

from __future__ import annotations

import os

from flightfeed.server.cluster import default_workers
from flightfeed.server.cores import available_cores


def test_one_process_per_two_cores_rounded_up() -> None:
    assert [default_workers(c) for c in (0, 1, 2, 3, 4, 5, 8, 16, 64)] == [1, 1, 1, 2, 2, 3, 4, 8, 32]


def test_available_cores_is_the_affinity_mask_at_most() -> None:
    cores = available_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0)) <= (os.cpu_count() or cores)
