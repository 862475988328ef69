"""Engines and sessions for the service's database: SQLite (default) or PostgreSQL via psycopg 3.

URLs look like `sqlite:////abs/path/fusionwatch.db` or `postgresql+psycopg://user@host:5432/name`.
The schema itself belongs to `migrations/`; nothing here creates tables.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, make_transient_to_detached, sessionmaker

from service.core.config import DEFAULT_POOL_SIZE


def make_engine(database_url: str, sqlite_immediate: bool = True, pool_size: int = DEFAULT_POOL_SIZE) -> Engine:
    """`sqlite_immediate=False` is for sessions that only read (tests looking behind the API's back):
    their transactions then never hold SQLite's write lock. `pool_size`: see DEFAULT_POOL_SIZE."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(database_url, sqlite_immediate, pool_size)
    if url.get_backend_name() == "postgresql" and url.get_driver_name() != "psycopg":
        raise ValueError(f"database URL {url!r}: use the psycopg 3 driver, postgresql+psycopg://...")
    # pre_ping: a long-lived service outlives PostgreSQL restarts; a stale pooled connection is retried.
    return create_engine(database_url, pool_pre_ping=True, pool_size=pool_size, max_overflow=pool_size)


T = TypeVar("T")
BUSY_TIMEOUT_S = 30.0


def _sqlite_engine(database_url: str, immediate: bool, pool_size: int) -> Engine:
    database = make_url(database_url).database
    a_plain_file = bool(database) and database != ":memory:" and not database.startswith("file:")
    if a_plain_file:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    # One writer at a time per engine, queued here rather than inside SQLite: a thread waiting for
    # SQLite's write lock polls it with sleeps growing to 100 ms, so under concurrent requests a
    # writer could wait seconds while the lock was free most of the time (webhook posts' p99 was
    # 1.5 s at a 14 ms median). Threads of this process now wait on a Python lock and are woken the
    # moment the previous transaction ends; other processes (the worker) still meet busy_timeout.
    writer_lock = threading.Lock() if immediate else None
    # In-memory and URI databases get SQLAlchemy's own pools, which have no size to set.
    pool = {"pool_size": pool_size, "max_overflow": pool_size} if a_plain_file else {}
    engine = create_engine(database_url, connect_args={"factory": _writer_connection(writer_lock)}, **pool)

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
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if database and database != ":memory:":
            cursor.execute("PRAGMA journal_mode = WAL")
            # In WAL mode NORMAL syncs the log at checkpoints instead of at every commit: a commit
            # survives the process being killed, and the file is never corrupted, but a power cut or
            # an operating-system crash may lose the last transactions committed. FULL's fsync per
            # commit cost 4-9 ms on this machine's disk, during which the write lock is held, so the
            # embedded database took at most 110-250 writes/s (PostgreSQL is the durable deployment).
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    # IMMEDIATE: a transaction takes the write lock when it starts. A deferred one that read first
    # and then writes cannot wait for the lock (SQLite answers "database is locked" at once, since
    # waiting could deadlock), which under concurrent requests failed writes; transactions here
    # are short, and in WAL mode readers outside a transaction are never blocked.
    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        if writer_lock is None:
            connection.exec_driver_sql("BEGIN")
            return
        dbapi_connection = connection.connection.dbapi_connection
        dbapi_connection.take_writer_lock()
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            dbapi_connection.release_writer_lock()
            raise

    return engine


def _writer_connection(writer_lock: threading.Lock | None) -> type[sqlite3.Connection]:
    """pysqlite's connection, holding `writer_lock` from BEGIN IMMEDIATE to the transaction's end
    (commit, rollback — the pool rolls back every connection it takes back — or close)."""

    class WriterConnection(sqlite3.Connection):
        holds_writer_lock = False

        def take_writer_lock(self) -> None:
            if writer_lock is None or self.holds_writer_lock:
                return
            # As long as SQLite's own busy_timeout, and failing the same way, so a thread that
            # opened a second writing transaction while holding one gets an error, not a hang.
            if not writer_lock.acquire(timeout=BUSY_TIMEOUT_S):
                raise sqlite3.OperationalError(f"database is locked (no write turn in {BUSY_TIMEOUT_S:.0f} s)")
            self.holds_writer_lock = True

        def release_writer_lock(self) -> None:
            if self.holds_writer_lock:
                self.holds_writer_lock = False
                writer_lock.release()

        def commit(self) -> None:
            super().commit()
            self.release_writer_lock()

        def rollback(self) -> None:
            try:
                super().rollback()
            finally:
                self.release_writer_lock()

        def close(self) -> None:
            try:
                super().close()
            finally:
                self.release_writer_lock()

    return WriterConnection


def adopt_inserted(session: Session, instance: T) -> T:
    """`instance`, every column set, whose row a Core INSERT just wrote: in the session as if loaded, so
    later changes to it are flushed as UPDATEs. On the webhook path a Core INSERT ... RETURNING id
    took a sixth of the CPU time of the ORM's flush of the same row."""
    make_transient_to_detached(instance)
    session.add(instance)
    return instance


def without_password(database_url: str) -> str:
    """The URL as it may be shown: in a log line, an error, the CLI's output."""
    return make_url(database_url).render_as_string(hide_password=True)


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
