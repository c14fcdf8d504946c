"""A real server with tenants, for the tenants tests: three datasets, two tenants and an operator."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.guards.tenants.rewrite import load_tenants
from flightfeed.server.guards.tenants.table import operator_tenant
from flightfeed.server.guards.tenants.tenants_file import Secrets
from flightfeed.server.request.streaming import StreamSettings
from flightfeed.server.testing import RunningServer, running_server

SECRETS = Secrets(read_file=lambda p: Path(p).read_bytes(), environ={})
OPERATOR_TOKEN = "operator-token-0"
TENANTS = """\
[tenant.vision]
token = "vision-token"
datasets = ["imagenet*"]

[tenant.speech]
token = "speech-token"
datasets = ["librispeech", "ghost*"]
"""
DATASETS = ("imagenet-train", "imagenet-val", "librispeech", "private-x")


@contextmanager
def tenant_server(
    data: Path, tmp_path: Path, text: str = TENANTS, *, message_bytes: int = 1 << 20, **kwargs: Any
) -> Iterator[tuple[RunningServer, TenantRegistry, Path]]:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    registry = TenantRegistry(
        load_tenants(str(path), SECRETS), operator=operator_tenant(OPERATOR_TOKEN), path=str(path),
        loader=lambda: load_tenants(str(path), SECRETS),
    )
    settings = StreamSettings(message_bytes=message_bytes)
    with running_server({n: str(data) for n in DATASETS}, tenants=registry, settings=settings, **kwargs) as srv:
        yield srv, registry, path


def client(location: str, token: str) -> tuple[flight.FlightClient, flight.FlightCallOptions]:
    headers: Any = [(b"authorization", f"Bearer {token}".encode())]
    options = flight.FlightCallOptions(headers=headers)
    return flight.FlightClient(location), options
