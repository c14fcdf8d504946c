"""The checked tenants of one ``--tenants`` file (or the one ``--auth-token-file`` token).

A token is kept only as ``sha256(salt + token)`` (an operator-given ``token_sha256`` has no salt);
a bearer token is matched against every credential of every tenant in constant time
(``hmac.compare_digest``), with no early exit. docs/security.md describes the file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from flightfeed.wire.tokens import normalize_token

__all__ = ["Credential", "Tenant", "TenantTable", "OPERATOR", "salted", "operator_tenant"]

#: the tenant the ``--auth-token-file`` token is: every dataset, every action (not a valid file name)
OPERATOR = "(operator)"
SALT_BYTES = 16


@dataclass(frozen=True)
class Credential:
    """One accepted token, as ``sha256(salt + token)``."""

    salt: bytes
    digest: bytes

    def matches(self, token: bytes) -> bool:
        return hmac.compare_digest(hashlib.sha256(self.salt + token).digest(), self.digest)

    def stored(self) -> str:
        """The ``token_sha256`` form: ``"SALT:HEX"`` (or ``"HEX"`` without a salt)."""
        return f"{self.salt.hex()}:{self.digest.hex()}" if self.salt else self.digest.hex()


def salted(token: str, salt: bytes | None = None) -> Credential:
    """A credential for ``token`` with a fresh random salt (or ``salt``)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return Credential(salt, hashlib.sha256(salt + token.encode()).digest())


@dataclass(frozen=True)
class Tenant:
    name: str
    credentials: frozenset[Credential]
    datasets: tuple[str, ...] = ("*",)
    weight: float = 1.0
    max_streams: int | None = None
    max_bytes_per_s: int | None = None
    #: the operator: every dataset, the node-wide figures and the peer actions
    operator: bool = False

    def may_read(self, dataset: str) -> bool:
        if self.operator:
            return True
        return any(fnmatch.fnmatchcase(dataset, pattern) for pattern in self.datasets)

    def visible(self, names: list[str]) -> list[str]:
        return [n for n in names if self.may_read(n)]


@dataclass(frozen=True)
class TenantTable:
    """Tenants by name; ``source`` names where they came from (for messages)."""

    tenants: dict[str, Tenant]
    source: str = "--tenants"
    _all: tuple[tuple[Credential, Tenant], ...] = field(default=(), repr=False)
    _memo: dict[bytes, Tenant | None] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        pairs = tuple((c, t) for t in self.tenants.values() for c in sorted(t.credentials, key=_order))
        object.__setattr__(self, "_all", pairs)

    def holder(self, token: bytes) -> Tenant | None:
        """The tenant holding ``token`` in this table, remembered per table (keyed by the token's
        SHA-256): what a running stream asks before each message, at the cost of a dict lookup."""
        key = hashlib.sha256(token).digest()
        try:
            return self._memo[key]
        except KeyError:
            pass
        found = self.identify(token)
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[key] = found[0] if found is not None else None
        return self._memo[key]

    def identify(self, token: bytes) -> tuple[Tenant, Credential] | None:
        """The tenant and credential ``token`` matches, or None. Every credential is compared
        (constant time each, no early exit), so the time taken does not say which matched."""
        found: tuple[Tenant, Credential] | None = None
        for cred, tenant in self._all:
            if cred.matches(token) and found is None:
                found = (tenant, cred)
        return found

    def allows(self, tenant: str, token: bytes, dataset: str) -> bool:
        """Whether a stream opened by ``tenant`` with ``token`` may still read ``dataset`` (the token
        is matched again, so a salt rewritten in the file changes nothing)."""
        current = self.holder(token)
        return current is not None and current.name == tenant and current.may_read(dataset)

    def with_operator(self, operator: Tenant | None) -> TenantTable:
        """This table plus the operator (the ``--auth-token-file`` token; the same object on every
        reload, so the operator's streams keep their credential)."""
        if operator is None:
            return self
        return TenantTable({**self.tenants, OPERATOR: operator}, self.source)


def _order(cred: Credential) -> bytes:
    return cred.salt + cred.digest


def operator_tenant(token: str) -> Tenant:
    """The ``--auth-token-file`` token: a tenant that may read every dataset and make every call."""
    return Tenant(OPERATOR, frozenset({salted(normalize_token(token, "the server's auth token"))}), operator=True)
