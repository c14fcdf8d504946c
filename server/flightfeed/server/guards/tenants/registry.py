"""The tenants in force: reloaded on SIGHUP or a change of the ``--tenants`` file, without a restart.

A reload swaps in a whole new :class:`TenantTable` (one reference: readers never see half a
file). A stream keeps the tenant name and token it opened with and asks :meth:`allows`
before each message, so an unchanged tenant's streams go on untouched and a revoked token's (or
a dataset taken from the tenant) end at their next message. A file that fails its checks keeps
the tenants in force and logs one line. docs/security.md has the rules.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from flightfeed.server.guards.tenants.table import Credential, Tenant, TenantTable
from flightfeed.wire.errors import ConfigError

__all__ = ["TenantRegistry", "Grant", "WATCH_INTERVAL_S"]

log = logging.getLogger("flightfeed.server.tenants")

#: how often the watcher looks at the file's mtime (a new token works within this of the change;
#: a stream also looks before each of its messages: :meth:`TenantRegistry.fresh`)
WATCH_INTERVAL_S = 0.2


@dataclass(frozen=True)
class Grant:
    """Who made a call: the tenant and the credential its token matched. A stream keeps the token
    (in memory only, never shown) to be matched again after a reload."""

    tenant: Tenant
    credential: Credential
    token: bytes = field(default=b"", repr=False)


class TenantRegistry:
    """The current tenants; ``loader`` (when given) re-reads them from ``path``."""

    def __init__(
        self,
        table: TenantTable,
        *,
        operator: Tenant | None = None,
        path: str | None = None,
        loader: Callable[[], TenantTable] | None = None,
    ) -> None:
        self._operator = operator
        self._table = table.with_operator(operator)
        self.path = path
        self._loader = loader
        self._lock = threading.Lock()
        self._stamp = _stamp(path)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reloads = 0
        self.failed_reloads = 0
        self.on_reload: list[Callable[[TenantTable], None]] = []

    @property
    def table(self) -> TenantTable:
        return self._table

    def identify(self, token: bytes) -> Grant | None:
        found = self._table.identify(token)
        return Grant(found[0], found[1], token) if found is not None else None

    def allows(self, grant: Grant, dataset: str) -> bool:
        """Whether a stream ``grant`` opened may send its next message of ``dataset``."""
        return self._table.allows(grant.tenant.name, grant.token, dataset)

    def current(self, grant: Grant) -> Tenant:
        """The tenant as the file says now (its limits may have changed); the grant's otherwise."""
        return self._table.tenants.get(grant.tenant.name, grant.tenant)

    def fresh(self) -> bool:
        """Reload now when the file changed since it was last read (one ``stat``): a stream asks
        before each message, so a revoked token's stream ends at its next message after the change,
        not only after the watcher's next look."""
        if self._loader is None or _stamp(self.path) == self._stamp:
            return False
        return self.reload(if_changed=True)

    def reload(self, *, if_changed: bool = False) -> bool:
        """Read the file again; on a problem keep the tenants in force and log one line.
        ``if_changed``: only when the file changed since the last read (streams racing to reload
        one change read it once)."""
        if self._loader is None:
            return False
        with self._lock:
            if if_changed and _stamp(self.path) == self._stamp:
                return False
            self._stamp = _stamp(self.path)
            try:
                table = self._loader()
            except ConfigError as exc:
                self.failed_reloads += 1
                log.error("tenants not reloaded, the ones in force stay: %s", exc)
                return False
            self._stamp = _stamp(self.path)  # a plain token hashed in place changed the file
            self._table = table.with_operator(self._operator)
            self.reloads += 1
        log.info("tenants reloaded from %s: %d tenant(s)", self.path, len(table.tenants))
        for hook in self.on_reload:
            hook(self._table)
        return True

    def request_reload(self) -> None:
        """Ask the watcher to reload now (safe in a signal handler)."""
        self._wake.set()

    def start(self, interval: float = WATCH_INTERVAL_S) -> None:
        """Watch the file: reload when its mtime, size or inode changes, or on :meth:`request_reload`."""
        if self._loader is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, args=(interval,), name="flightfeed-tenants", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self, interval: float) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if woken or _stamp(self.path) != self._stamp:
                self.reload()


def _stamp(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
