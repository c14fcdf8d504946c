"""The sidecar's FastAPI app: ``/metrics``, ``/stats``, ``/healthz``, ``/readyz`` and ``/``.

Handlers are plain functions: FastAPI runs them on its thread pool, so a slow Flight call
(the standalone sidecar asks the server over gRPC) never blocks the event loop.

With a ``token`` (the server's ``--auth-token-file``), ``/metrics`` and ``/stats`` want
``Authorization: Bearer <token>`` and answer 401 without it; ``/healthz`` and ``/readyz`` stay
open for probes. ``/`` without the token answers 401 with the dashboard's static page, which
holds no figures: the page asks for the token (or takes it from ``#token=...`` in its URL), keeps
it in a variable of the page and sends it with every ``/stats`` request.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from flightfeed.server.guards.auth import bearer_matches
from flightfeed.server.guards.tenants.middleware import bearer_token
from flightfeed.server.guards.tenants.registry import TenantRegistry
from flightfeed.server.guards.tenants.table import Tenant
from flightfeed.server.observe.tenant_view import tenant_view
from flightfeed.server.sidecar.sources import StatsSource, not_ready_reason
from flightfeed.wire.errors import FlightFeedError
from flightfeed.wire.tokens import normalize_token

__all__ = ["create_app", "dashboard_html"]

_NO_STORE = {"Cache-Control": "no-store"}
_CHALLENGE = {**_NO_STORE, "WWW-Authenticate": 'Bearer realm="flightfeed sidecar"'}


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The self-contained dashboard page (shipped in the wheel next to this module)."""
    return resources.files("flightfeed.server.sidecar").joinpath("dashboard.html").read_text(encoding="utf-8")


def create_app(source: StatsSource, token: str | None = None, tenants: TenantRegistry | None = None) -> FastAPI:
    """The sidecar app over ``source`` (a LocalSource or a RemoteSource); ``token``: see the module doc.
    With ``tenants``, a tenant's token gets ``/stats`` cut to its own datasets and row
    (``observe.tenant_view``) and 403 on ``/metrics``; the operator's (``token``) sees everything."""
    app = FastAPI(
        title="flightfeed sidecar",
        description="Metrics, stats, health and a live dashboard of one flightfeed data node.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.source = source
    secret = normalize_token(token, "the sidecar's token").encode() if token is not None else None

    def allowed(request: Request) -> bool:
        return secret is None or bearer_matches(request.headers.get("authorization"), secret)

    def tenant(request: Request) -> Tenant | None:
        given = bearer_token(request.headers.get("authorization"))
        grant = tenants.identify(given) if tenants is not None and given else None
        return grant.tenant if grant is not None and not grant.tenant.operator else None

    def tenant_refused(who: Tenant) -> JSONResponse:
        return JSONResponse(
            {"error": f"tenant {who.name!r} may read /stats (its own datasets) only; /metrics is the operator's"},
            status_code=403,
            headers=_NO_STORE,
        )

    def refused() -> JSONResponse:
        return JSONResponse(
            {"error": "this sidecar wants 'Authorization: Bearer <token>' (the server's --auth-token-file)"},
            status_code=401,
            headers=_CHALLENGE,
        )

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        if not allowed(request):
            who = tenant(request)
            return tenant_refused(who) if who is not None else refused()
        return Response(source.prometheus_text(), media_type=CONTENT_TYPE_LATEST, headers=_NO_STORE)

    @app.get("/stats")
    def stats(request: Request) -> JSONResponse:
        who = None
        if not allowed(request):
            who = tenant(request)
            if who is None:
                return refused()
        try:
            body: dict[str, Any] = source.stats()
        except FlightFeedError as exc:
            return JSONResponse({"error": str(exc), "flight_up": False}, status_code=503, headers=_NO_STORE)
        if who is not None:
            body = tenant_view(body, who.name, who.may_read)
        return JSONResponse(body, headers=_NO_STORE)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"}, headers=_NO_STORE)

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        if source.ready():
            return JSONResponse({"status": "ready"}, headers=_NO_STORE)
        return JSONResponse(
            {"status": "unready", "reason": not_ready_reason(source)},
            status_code=503,
            headers=_NO_STORE,
        )

    @app.get("/", response_class=HTMLResponse)
    def dashboard(request: Request) -> HTMLResponse:
        if not allowed(request):  # the static page only: it asks for the token, then fetches /stats
            return HTMLResponse(dashboard_html(), status_code=401, headers=_CHALLENGE)
        return HTMLResponse(dashboard_html(), headers=_NO_STORE)

    return app
