"""Dependencies the routes declare, as `Annotated` aliases (`session: SessionDep`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session


def get_session(request: Request) -> Iterator[Session]:
    # The factory lives on the app (see service.app.create_app), so each app, and each test, has its own database.
    with request.app.state.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
