"""Dependencies the routes declare, as `Annotated` aliases (`session: SessionDep`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
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


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.services.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
ServicesDep = Annotated[Services, Depends(get_services)]
