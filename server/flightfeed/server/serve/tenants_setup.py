"""``flightfeed serve --tenants FILE``: the tenants, read at the CLI (the only place that reads the
environment and secret files for them), watched for changes and reloaded on SIGHUP.

With tenants, the node's own calls (its ``--workers`` processes, peers, the sidecar) use the
operator token: ``--auth-token-file`` when given, else a random one made here and handed to the
worker processes in a private file. docs/security.md describes the file and the rules.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.guards.tenants.rewrite import load_tenants
from flightfeed.server.guards.tenants.table import operator_tenant
from flightfeed.server.guards.tenants.tenants_file import Secrets
from flightfeed.wire.errors import ConfigError

__all__ = ["TenantSetup", "setup_tenants", "forward_sighup"]


@dataclass
class TenantSetup:
    registry: TenantRegistry | None
    #: the operator token the node's own calls use (None: no authentication at all)
    token: str | None
    #: the file the worker processes read it from (``--auth-token-file``)
    token_file: str | None


def setup_tenants(path: Any, token: str | None, token_file: str | None, environ: Mapping[str, str]) -> TenantSetup:
    """The registry of ``--tenants path`` (None without it), watched, with SIGHUP asking a reload."""
    if not path:
        return TenantSetup(None, token, token_file)
    path = str(path)
    found = Secrets(read_file=lambda p: Path(p).read_bytes(), environ=dict(environ))
    table = load_tenants(path, found)
    if token is None:  # the node's own calls need a token no tenant holds
        token = secrets.token_hex(32)
        token_file = _private_file(token)
    elif table.identify(token.encode()) is not None:
        raise ConfigError(
            f"--auth-token-file {token_file} holds a tenant's token (--tenants {path}): the operator token "
            "reads every dataset; give it a secret of its own (e.g. `openssl rand -hex 32`)"
        )
    registry = TenantRegistry(
        table, operator=operator_tenant(token), path=path, loader=lambda: load_tenants(path, found)
    )
    registry.start()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda _signum, _frame: registry.request_reload())
    return TenantSetup(registry, token, token_file)


def _private_file(token: str) -> str:
    folder = tempfile.mkdtemp(prefix="flightfeed-operator-")  # mode 0700
    path = os.path.join(folder, "token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    atexit.register(shutil.rmtree, folder, True)
    return path




def forward_sighup(registry: TenantRegistry, workers: Any) -> None:
    """SIGHUP: reload here and pass the signal on to the ``--workers`` processes (``WorkerPool``)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGHUP"):
        return

    def on_hup(signum: int, _frame: Any) -> None:
        registry.request_reload()
        workers.send_signal(signum)

    signal.signal(signal.SIGHUP, on_hup)
