"""An API token for a benchmark's requests, made straight in the database it serves (service/auth.py)."""

from __future__ import annotations

from service.adapters.db import make_engine, make_session_factory
from service.usecases.tokens import create_token


def bench_token(database_url: str, name: str, scope: str) -> str:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session, session.begin():
            return create_token(session, name, scope=scope).token
    finally:
        engine.dispose()
