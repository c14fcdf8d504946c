"""Bearer-token checks shared by the sidecar: ``Authorization: Bearer <token>`` against one token.

The Flight server identifies every call's tenant (or the ``--auth-token-file`` operator) in
``guards.tenants.middleware``; tokens are compared in constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac

__all__ = ["bearer_matches"]


def bearer_matches(header: str | bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (constant-time compare)."""
    if header is None:
        return False
    raw = header if isinstance(header, bytes) else header.encode("utf-8", "replace")
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
