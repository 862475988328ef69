"""Whether a database's schema is the one this code needs: checked before serving or working, so a
missing `fusionwatch db upgrade` fails at once with that advice, not later as "no such table"."""

from __future__ import annotations

from dataclasses import dataclass

from service.adapters import migrate


@dataclass(frozen=True)
class MigrationState:
    current: str | None  # None: no migration has touched the database
    head: str | None  # the newest migration in migrations/

    @property
    def ready(self) -> bool:
        return self.current == self.head


def migration_state(database_url: str | None = None) -> MigrationState:
    """`database_url` None: the configured database (FUSIONWATCH_DATABASE_URL)."""
    return MigrationState(current=migrate.current_revision(database_url), head=migrate.head_revision())
