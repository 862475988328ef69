"""Alembic's entry point: which database, and the metadata autogenerate compares against.

The URL comes from `service.core.config.settings`, like the service's own. A caller that already
holds a connection (the `fusionwatch db` commands, the tests) passes it as
`config.attributes["connection"]`, so the migration runs on exactly that database and schema.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from service.adapters.db import make_engine
from service.core.config import settings
from service.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs) -> None:
    # compare_type: autogenerate notices a column whose type changed, not only added/removed ones.
    context.configure(target_metadata=target_metadata, compare_type=True, **kwargs)


def run_migrations_offline() -> None:
    """`alembic upgrade head --sql`: print the SQL instead of running it."""
    _configure(url=settings.database_url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = make_engine(settings.database_url)
    try:
        with engine.connect() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
