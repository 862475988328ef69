"""The FastAPI application: routes mounted under /api/v1."""

from __future__ import annotations

import logging

from fastapi import FastAPI

from service.api.routes import health, optimize

log = logging.getLogger("fusionwatch.service")


def create_app() -> FastAPI:
    app = FastAPI(
        title="fusionwatch",
        summary="Fusion-regression detection for ONNX models",
        version="0.1.0",
    )
    app.include_router(health.router, prefix="/api/v1")
    app.include_router(optimize.router, prefix="/api/v1")
    return app
