"""Engines and sessions for the service's database: SQLite (default) or PostgreSQL via psycopg 3.

URLs look like `sqlite:////abs/path/fusionwatch.db` or `postgresql+psycopg://user@host:5432/name`.
The schema itself belongs to `migrations/`; nothing here creates tables.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def make_engine(database_url: str, sqlite_immediate: bool = True) -> Engine:
    """`sqlite_immediate=False` is for sessions that only read (tests looking behind the API's back):
    their transactions then never hold SQLite's write lock."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(database_url, sqlite_immediate)
    if url.get_backend_name() == "postgresql" and url.get_driver_name() != "psycopg":
        raise ValueError(f"database URL {url!r}: use the psycopg 3 driver, postgresql+psycopg://...")
    # pre_ping: a long-lived service outlives PostgreSQL restarts; a stale pooled connection is retried.
    return create_engine(database_url, pool_pre_ping=True)


def _sqlite_engine(database_url: str, immediate: bool) -> Engine:
    database = make_url(database_url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(database_url)

    # pysqlite opens transactions only before INSERT/UPDATE/DELETE, so DDL and reads run outside
    # them and a failed migration or upload could leave half its work behind. Turning its own
    # handling off and emitting BEGIN ourselves makes every SQLAlchemy transaction a real one
    # (SQLAlchemy's documented recipe for pysqlite).
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # SQLite ignores REFERENCES unless asked, per connection, outside a transaction.
        cursor.execute("PRAGMA foreign_keys = ON")
        # The API and the worker process share the file: in WAL mode a reader never blocks the
        # writer (nor the writer a reader), and a writer waits for another instead of failing at once.
        cursor.execute("PRAGMA busy_timeout = 30000")
        if database and database != ":memory:":
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    # IMMEDIATE: a transaction takes the write lock when it starts. A deferred one that read first
    # and then writes cannot wait for the lock (SQLite answers "database is locked" at once, since
    # waiting could deadlock), which under concurrent requests failed writes; transactions here
    # are short, and in WAL mode readers outside a transaction are never blocked.
    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # Objects stay readable after commit so a handler can build its response from what it stored.
    return sessionmaker(bind=engine, expire_on_commit=False)


class DatabaseOutage:
    """How a long-running loop (the worker, its supervisor) rides out a database that went away: one
    warning when it goes, one line when it is back, and waits growing from 0.5 s to 5 s in between
    (pool_pre_ping then finds fresh connections)."""

    FIRST_WAIT_S, LONGEST_WAIT_S = 0.5, 5.0

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._wait_s = 0.0

    def wait_after(self, error: Exception) -> float:
        if not self._wait_s:
            reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0][:300]
            self._log.warning("database unavailable; retrying", extra={"error": reason})
        self._wait_s = min(self.LONGEST_WAIT_S, max(self.FIRST_WAIT_S, self._wait_s * 2))
        return self._wait_s

    def over(self) -> None:
        if self._wait_s:
            self._log.warning("database reachable again")
            self._wait_s = 0.0
