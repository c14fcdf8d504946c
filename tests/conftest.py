"""Shared fixtures: small real Arrow datasets and real servers on 127.0.0.1 port 0."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightfeed.server.testing import RunningServer, running_server
from tests.support.datasets import SMALL_LAYOUT, write_dataset

# the storage fixtures (moto S3, metrics, small Arrow datasets) for tests/storage, tests/convert, tests/readers, ...
pytest_plugins = ["tests.support.storage_fixtures"]

# Nothing in the tests may reach for instance credentials (a non-loopback address).
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 shards with uneven record batches: 422 rows."""
    root = tmp_path_factory.mktemp("small")
    write_dataset(root, SMALL_LAYOUT)
    return root


@pytest.fixture(scope="session")
def server(small_dir: Path) -> Iterator[RunningServer]:
    with running_server({"small": str(small_dir)}) as srv:
        yield srv
