"""Who is calling: Flight server middleware that matches the bearer token against the tenants.

Every call must carry ``authorization: Bearer <token>``; a token no tenant holds is answered with
``Unauthenticated`` (FlightUnauthenticatedError). A matched call carries its :class:`Grant`, which
the service reads with :func:`caller` (docs/security.md).
"""

from __future__ import annotations

from typing import Any

import pyarrow.flight as flight

from flightfeed.server.guards.tenants.registry import Grant, TenantRegistry
from flightfeed.wire.errors import Unauthenticated, error_tag

__all__ = ["TenantAuthFactory", "caller", "bearer_token", "MIDDLEWARE_KEY"]

MIDDLEWARE_KEY = "auth"


class _Caller(flight.ServerMiddleware):
    def __init__(self, grant: Grant) -> None:
        super().__init__()
        self.grant = grant


class TenantAuthFactory(flight.ServerMiddlewareFactory):
    def __init__(self, registry: TenantRegistry) -> None:
        super().__init__()
        self.registry = registry

    def start_call(self, info: Any, headers: Any) -> flight.ServerMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        for value in values:
            token = bearer_token(value)
            grant = self.registry.identify(token) if token else None
            if grant is not None:
                return _Caller(grant)
        raise flight.FlightUnauthenticatedError(
            error_tag(Unauthenticated("missing or wrong bearer token: pass your tenant's token to the client"))
        )


def bearer_token(header: str | bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (None for another scheme)."""
    if header is None:
        return None
    raw = header if isinstance(header, bytes) else header.encode("utf-8", "replace")
    scheme, _, given = raw.partition(b" ")
    return given.strip() if scheme.lower() == b"bearer" else None


def caller(context: Any) -> Grant | None:
    """The grant of the call behind ``context`` (None: the server has no tokens)."""
    if context is None:
        return None
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware.grant if isinstance(middleware, _Caller) else None
