"""Dependencies the routes declare, as `Annotated` aliases (`session: SessionDep`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings
from service.storage import ModelStore
from service.usecases.models import UploadLimits


@dataclass
class Services:
    """What one app was built with (service.app.create_app): each app, and each test, has its own."""

    settings: Settings
    session_factory: sessionmaker[Session]
    # Sessions that only read: on SQLite their transactions never take the write lock (service/db.py).
    read_session_factory: sessionmaker[Session]
    store: ModelStore
    upload_limits: UploadLimits


def get_services(request: Request) -> Services:
    return request.app.state.services


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for one request. Opening one does no I/O, so it is made on the event loop rather
    than in a worker thread (a sync dependency costs two thread hops per request); closing it is
    I/O only while it still holds a connection (a read's transaction), and then runs in a thread."""
    session = request.app.state.services.session_factory()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


SessionDep = Annotated[Session, Depends(get_session)]
ServicesDep = Annotated[Services, Depends(get_services)]
