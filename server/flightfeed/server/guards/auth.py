"""Bearer-token authentication as Flight server middleware (``--auth-token-file``).

Every call must carry ``authorization: Bearer <token>``; a wrong or missing token is answered
with FlightUnauthenticatedError. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from typing import Any

import pyarrow.flight as flight

from flightfeed.wire.errors import Unauthenticated, error_tag
from flightfeed.wire.tokens import normalize_token

__all__ = ["TokenAuthFactory", "bearer_matches"]


class _Pass(flight.ServerMiddleware):
    pass


class TokenAuthFactory(flight.ServerMiddlewareFactory):
    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = normalize_token(token, "the server's auth token").encode()

    def start_call(self, info: Any, headers: Any) -> flight.ServerMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        for value in values:
            if bearer_matches(value, self._token):
                return _Pass()
        raise flight.FlightUnauthenticatedError(
            error_tag(Unauthenticated("missing or wrong bearer token: pass the server's token to the client"))
        )


def bearer_matches(header: str | bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (constant-time compare)."""
    if header is None:
        return False
    raw = header if isinstance(header, bytes) else header.encode("utf-8", "replace")
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
