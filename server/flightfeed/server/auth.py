"""Bearer-token authentication as Flight server middleware (``--auth-token-file``).

Every call must carry ``authorization: Bearer <token>``; a wrong or missing token is answered
with FlightUnauthenticatedError. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from typing import Any

import pyarrow.flight as flight

from flightfeed.wire.errors import Unauthenticated, error_tag

__all__ = ["TokenAuthFactory"]


class _Pass(flight.ServerMiddleware):
    pass


class TokenAuthFactory(flight.ServerMiddlewareFactory):
    def __init__(self, token: str) -> None:
        super().__init__()
        if not token:
            raise ValueError("empty auth token")
        self._token = token.encode()

    def start_call(self, info: Any, headers: Any) -> flight.ServerMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        for value in values:
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token):
                return _Pass()
        raise flight.FlightUnauthenticatedError(
            error_tag(Unauthenticated("missing or wrong bearer token: pass the server's token to the client"))
        )
