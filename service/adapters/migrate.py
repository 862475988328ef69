"""Apply the schema migrations in `migrations/` to a database, from Python (no `alembic` process).

`fusionwatch db upgrade` and the tests call these; the migrations run on one connection inside
one transaction, so on PostgreSQL (transactional DDL) a failing migration leaves nothing behind.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from service.adapters.db import make_engine
from service.core.config import REPO_ROOT, settings

ALEMBIC_INI = REPO_ROOT / "alembic.ini"


def alembic_config() -> Config:
    if not ALEMBIC_INI.is_file():
        raise FileNotFoundError(
            f"{ALEMBIC_INI}: not found; `fusionwatch db` needs the source checkout's alembic.ini and migrations/"
        )
    return Config(str(ALEMBIC_INI))


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    _run(command.upgrade, database_url, revision)


def downgrade(revision: str, database_url: str | None = None) -> None:
    _run(command.downgrade, database_url, revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(database_url: str | None = None) -> str | None:
    """The revision the database is at; None for a database no migration has touched."""
    engine = make_engine(database_url or settings.database_url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def _run(alembic_command, database_url: str | None, revision: str) -> None:
    config = alembic_config()
    engine = make_engine(database_url or settings.database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            alembic_command(config, revision)
    finally:
        engine.dispose()
