"""Database fixtures for the service's tests: every test gets its own empty database.

Each database-backed test runs on SQLite (a file under tmp_path) and, when
FUSIONWATCH_TEST_DATABASE_URL names a PostgreSQL server (CI sets
postgresql+psycopg://postgres@127.0.0.1:5432/test), also on PostgreSQL, in a schema of its own
that is dropped afterwards, so tests running in parallel never see each other's rows.

`tests/service/conftest.py` and `tests/test_cli.py` import these fixtures.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.adapters import migrate
from service.adapters.db import make_engine, make_session_factory
from service.app import create_app
from service.core.config import Settings
from service.usecases.tokens import create_token

TEST_DATABASE_URL_ENV = "FUSIONWATCH_TEST_DATABASE_URL"


def _backends() -> list:
    backends = [pytest.param("sqlite", id="sqlite")]
    if os.environ.get(TEST_DATABASE_URL_ENV):
        backends.append(pytest.param("postgresql", id="postgresql"))
    return backends


def on_postgresql_only():
    """A test's `database_url` on PostgreSQL alone: for behaviour of concurrent writers, which SQLite
    does not have (it writes one transaction at a time)."""
    missing = pytest.mark.skipif(not os.environ.get(TEST_DATABASE_URL_ENV),
                                 reason=f"no PostgreSQL server to test on: set {TEST_DATABASE_URL_ENV}")
    return pytest.mark.parametrize("database_url", [pytest.param("postgresql", id="postgresql", marks=missing)],
                                   indirect=True)


@pytest.fixture(params=_backends())
def database_url(request, tmp_path) -> Iterator[str]:
    """The URL of an empty database (no tables, no migrations applied) for one test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fusionwatch.db'}"
    else:
        yield from _postgresql_schema(os.environ[TEST_DATABASE_URL_ENV])


def _postgresql_schema(server_url: str) -> Iterator[str]:
    url = make_url(server_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"{TEST_DATABASE_URL_ENV}={server_url!r}: expected a postgresql+psycopg:// URL")
    schema = f"test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(server_url)
    with admin.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        # search_path in the URL: migrations, the app and the test's own sessions all land in the schema.
        scoped = url.update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture
def migrated_database_url(database_url) -> str:
    """The URL of a database at the newest migration, with no rows."""
    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def service_settings(tmp_path) -> Settings:
    """The app's settings for one test: its own data directory, the default limits."""
    return Settings(data_dir=tmp_path / "data")


def make_token(database_url: str, name: str = "test-writer", scope: str = "write", project: str | None = None) -> str:
    """A new API token on the database, as `fusionwatch token create` makes one."""
    engine = make_engine(database_url, sqlite_immediate=False)
    try:
        with make_session_factory(engine)() as db_session, db_session.begin():
            return create_token(db_session, name, scope, project).token
    finally:
        engine.dispose()


@pytest.fixture
def client(migrated_database_url, service_settings) -> Iterator[TestClient]:
    """The app, in-process, holding a write token for every project (tests/service/test_auth.py
    checks what happens without one)."""
    # `with` runs the app's lifespan (its migration check) and disposes its engine afterwards.
    # No worker process: tests run queued jobs in-process with tests.service.jobs.drain.
    with TestClient(create_app(migrated_database_url, service_settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {make_token(migrated_database_url)}"
        yield test_client


@pytest.fixture
def session(migrated_database_url) -> Iterator[Session]:
    """A session on the test's database, for looking behind the API's back. Its SQLite transactions are
    deferred, so a test holding one open never blocks the app's writes."""
    engine = make_engine(migrated_database_url, sqlite_immediate=False)
    try:
        with make_session_factory(engine)() as db_session:
            yield db_session
    finally:
        engine.dispose()
