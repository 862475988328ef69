"""The FastAPI application: routes mounted under /api/v1, one database per app.

`create_app(database_url, config, start_worker=True)` is what `fusionwatch serve` runs: the API plus the
embedded worker process (service/worker/embedded.py) unless jobs go to Celery (FUSIONWATCH_BROKER_URL).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy.exc import OperationalError

from optimizer.text import shorten
from service import web
from service.adapters.db import make_engine, make_session_factory
from service.adapters.storage import ModelStore
from service.api.request_bodies import BodyLimit
from service.api.routes import alerts, bisect, feed_sets, health, metrics, projects, results, runs, webhooks
from service.auth import API_ACCESS, LoginRequired, login_url
from service.core.config import Settings, settings
from service.core.limits import upload_limits
from service.errors import ServiceError
from service.queries.migration_state import migration_state
from service.services import Services
from service.usecases import history_points

log = logging.getLogger("fusionwatch.service")


class DatabaseNotMigrated(RuntimeError):
    """The database's schema is not the one this code expects."""


def create_app(database_url: str | None = None, config: Settings | None = None, start_worker: bool = False) -> FastAPI:
    """The service, on `database_url` (default: the settings', env FUSIONWATCH_DATABASE_URL).

    Starting it (the lifespan) checks that the database is at the newest migration, so a missing
    `fusionwatch db upgrade` fails at once with that advice, not later as "no such table".
    """
    config = config or settings
    url = database_url or config.database_url
    engine = make_engine(url, pool_size=config.database_pool_size)
    read_engine = make_engine(url, sqlite_immediate=False, pool_size=config.database_pool_size) if engine.dialect.name == "sqlite" else engine
    services = Services(
        settings=config,
        session_factory=make_session_factory(engine),
        read_session_factory=make_session_factory(read_engine),
        store=ModelStore(config.data_dir),
        upload_limits=upload_limits(config),
        database=engine.url.render_as_string(hide_password=True),
        broker_url=config.broker_url or None,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = migration_state(url)
        if not state.ready:
            raise DatabaseNotMigrated(
                f"database {engine.url!r} is at migration {state.current or 'none'}, the code needs {state.head}; "
                "run `fusionwatch db upgrade`"
            )
        log.info("database ready", extra={"database": repr(engine.url), "revision": state.current})
        history_points.warm_up(services.read_session_factory)
        worker = None
        if start_worker and not config.broker_url:
            from service.worker.embedded import EmbeddedWorker

            worker = EmbeddedWorker(services, url)
            worker.start()
            app.state.worker = worker
        yield
        if worker is not None:
            worker.stop()
        engine.dispose()
        read_engine.dispose()

    app = FastAPI(
        title="fusionwatch",
        summary="Fusion-regression detection for ONNX models",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.services = services
    app.add_middleware(BodyLimit, max_upload_bytes=services.upload_limits.max_bytes)
    app.state.worker = None

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, error: ServiceError) -> Response:
        if isinstance(error, LoginRequired):
            return RedirectResponse(login_url(error.next_url), status_code=303)
        if not request.url.path.startswith(("/api/", "/metrics")):
            return web.error_page(request, error)
        return JSONResponse({"detail": error.message}, status_code=error.status)

    @app.exception_handler(OperationalError)
    async def _database_unavailable(request: Request, error: OperationalError) -> JSONResponse:
        # A restart or failover: the pool reconnects on the next request (pool_pre_ping), nothing was written.
        reason = str(error.orig or error).strip().splitlines()[0][:300]
        log.warning("database unavailable", extra={"path": request.url.path, "error": reason})
        return JSONResponse({"detail": "the database is unavailable; try again shortly"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        # One sentence naming the field, and never the submitted value (it may be a tensor's worth); a
        # field named by a posted key is named by its start.
        problems = [f"{'.'.join(shorten(str(p), 60) for p in e.get('loc', ()))}: {e.get('msg')}"
                    for e in error.errors()[:5]]
        return JSONResponse({"detail": "; ".join(problems), "errors": problems}, status_code=422)

    # Health and the webhooks check their callers themselves (service/auth.py says who may do what).
    for router in (health.router, webhooks.router):
        app.include_router(router, prefix="/api/v1")
    for router in (projects.router, feed_sets.router, results.router, runs.router, alerts.router, bisect.router, metrics.router):
        app.include_router(router, prefix="/api/v1", dependencies=API_ACCESS)
    app.include_router(metrics.router, dependencies=API_ACCESS)  # Prometheus scrapes /metrics by default
    app.include_router(web.sign_in_router)
    app.include_router(web.router)  # the dashboard's pages, at /; PAGE_ACCESS on each
    return app


def _settle_garbage_collection() -> None:
    """Once the app is loaded: what exists now (modules, the app, its ORM mappers: ~200,000 objects)
    is moved out of the collector's sight, and the youngest generation is collected every 10,000 new
    objects instead of every 700. A request building a 10,000-commit history makes ~100,000 objects,
    and each full collection on the way walked everything the process holds: reads then took 100 to
    430 ms instead of about 100. Webhooks, a few thousand objects each, set off collections too."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def serving_app() -> FastAPI:
    """What `fusionwatch serve` runs (a uvicorn factory): settings read from the environment now, the
    embedded worker started unless FUSIONWATCH_BROKER_URL sends jobs to Celery."""
    app = create_app(config=Settings(), start_worker=True)
    _settle_garbage_collection()  # a server process's, not each app a test makes (frozen objects are never freed)
    return app
