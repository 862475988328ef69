"""The database's schema is moved to a migration (`fusionwatch db upgrade` / `db downgrade`).

The migrations run on their own engine inside one transaction (service/adapters/migrate.py), so a
failing one on PostgreSQL leaves nothing behind. Each returns the revision the database is at after,
which the CLI prints, so a user sees where they landed even when the revision was relative ("-1").
"""

from __future__ import annotations

from service.adapters import migrate


def upgrade_database(database_url: str, revision: str = "head") -> str | None:
    migrate.upgrade(database_url, revision)
    return migrate.current_revision(database_url)


def downgrade_database(database_url: str, revision: str) -> str | None:
    """`revision` "base" drops every table; the revision reached is then None."""
    migrate.downgrade(revision, database_url)
    return migrate.current_revision(database_url)
