"""The sidecar's FastAPI app: ``/metrics``, ``/stats``, ``/healthz``, ``/readyz`` and ``/``.

Handlers are plain functions: FastAPI runs them on its thread pool, so a slow Flight call
(the standalone sidecar asks the server over gRPC) never blocks the event loop.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from flightfeed.server.sidecar.sources import StatsSource
from flightfeed.wire.errors import FlightFeedError

__all__ = ["create_app", "dashboard_html"]

_NO_STORE = {"Cache-Control": "no-store"}


@lru_cache(maxsize=1)
def dashboard_html() -> str:
    """The self-contained dashboard page (shipped in the wheel next to this module)."""
    return resources.files("flightfeed.server.sidecar").joinpath("dashboard.html").read_text(encoding="utf-8")


def create_app(source: StatsSource) -> FastAPI:
    """The sidecar app over ``source`` (a LocalSource or a RemoteSource)."""
    app = FastAPI(
        title="flightfeed sidecar",
        description="Metrics, stats, health and a live dashboard of one flightfeed data node.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.source = source

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(source.prometheus_text(), media_type=CONTENT_TYPE_LATEST, headers=_NO_STORE)

    @app.get("/stats")
    def stats() -> JSONResponse:
        try:
            body: dict[str, Any] = source.stats()
        except FlightFeedError as exc:
            return JSONResponse({"error": str(exc), "flight_up": False}, status_code=503, headers=_NO_STORE)
        return JSONResponse(body, headers=_NO_STORE)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"}, headers=_NO_STORE)

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        if source.ready():
            return JSONResponse({"status": "ready"}, headers=_NO_STORE)
        return JSONResponse(
            {"status": "unready", "reason": "the Flight server does not answer a 'health' action"},
            status_code=503,
            headers=_NO_STORE,
        )

    @app.get("/", response_class=HTMLResponse)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html(), headers=_NO_STORE)

    return app
