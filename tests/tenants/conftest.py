"""A dataset large enough that a stream outlives gRPC's buffers (many messages in flight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.datasets import write_dataset

BIG_ROWS = 200_000


@pytest.fixture(scope="session")
def big_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("big")
    write_dataset(root, [[50_000, 50_000], [50_000, 50_000]])
    return root
