"""The FastAPI application: routes mounted under /api/v1, one database per app."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import migrate
from service.api.routes import health, models, optimize
from service.core.config import settings
from service.db import make_engine, make_session_factory

log = logging.getLogger("fusionwatch.service")


class DatabaseNotMigrated(RuntimeError):
    """The database's schema is not the one this code expects."""


def create_app(database_url: str | None = None) -> FastAPI:
    """The service, on `database_url` (default: settings.database_url, env FUSIONWATCH_DATABASE_URL).

    Starting it (the lifespan) checks that the database is at the newest migration, so a missing
    `fusionwatch db upgrade` fails at once with that advice, not later as "no such table".
    """
    url = database_url or settings.database_url
    engine = make_engine(url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        current, head = migrate.current_revision(url), migrate.head_revision()
        if current != head:
            raise DatabaseNotMigrated(
                f"database {engine.url!r} is at migration {current or 'none'}, the code needs {head}; "
                "run `fusionwatch db upgrade`"
            )
        log.info("database ready", extra={"database": repr(engine.url), "revision": current})
        yield
        engine.dispose()

    app = FastAPI(
        title="fusionwatch",
        summary="Fusion-regression detection for ONNX models",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.session_factory = make_session_factory(engine)
    app.include_router(health.router, prefix="/api/v1")
    app.include_router(optimize.router, prefix="/api/v1")
    app.include_router(models.router, prefix="/api/v1")
    return app
