"""Dependencies the routes declare, as `Annotated` aliases (`session: SessionDep`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from service.services import Services


def get_services(request: Request) -> Services:
    return request.app.state.services


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for one request. Opening one does no I/O, so it is made on the event loop rather
    than in a worker thread (a sync dependency costs two thread hops per request)."""
    session = request.app.state.services.session_factory()
    try:
        yield session
    finally:
        await _close(session)


async def get_read_session(request: Request) -> AsyncIterator[Session]:
    """A session for a request that only reads: on SQLite it never holds the write lock, so a long
    read (a 10,000-commit history) does not stall the webhooks' writes meanwhile."""
    session = request.app.state.services.read_session_factory()
    try:
        yield session
    finally:
        await _close(session)


async def _close(session: Session) -> None:
    # I/O only while the session still holds a connection (a read's transaction): then in a thread.
    if session.in_transaction():
        await run_in_threadpool(session.close)
    else:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]
ServicesDep = Annotated[Services, Depends(get_services)]
